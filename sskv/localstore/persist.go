package localstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/dsslock/dsslock/hlc"
)

// PersistMode says which keys the store keeps on disk, in Config.DataDir,
// across a restart. The names are the service's: its broker persists keys
// per its stateStore persistence mode.
type PersistMode int

const (
	// PersistNone keeps every key in memory only: all are gone after a
	// restart (the default).
	PersistNone PersistMode = iota
	// PersistDynamic persists the keys whose latest SET carried the user
	// property aio-persistence: true (sskv's SetOptions.Persist, the Go
	// SDK's WithPersist): the service's "dynamic" persistence.
	PersistDynamic
	// PersistAll persists every key.
	PersistAll
)

// String returns the mode's name, as ParsePersistMode takes it.
func (m PersistMode) String() string {
	switch m {
	case PersistNone:
		return "none"
	case PersistDynamic:
		return "dynamic"
	case PersistAll:
		return "all"
	}
	return fmt.Sprintf("PersistMode(%d)", int(m))
}

// ParsePersistMode parses "none", "dynamic" or "all".
func ParsePersistMode(s string) (PersistMode, error) {
	switch strings.ToLower(s) {
	case "none", "":
		return PersistNone, nil
	case "dynamic":
		return PersistDynamic, nil
	case "all":
		return PersistAll, nil
	}
	return PersistNone, fmt.Errorf("localstore: unknown persistence mode %q (want none, dynamic or all)", s)
}

// MsgPersistFailed answers a write the store could not make durable (its
// data directory could not be written: a full disk, an I/O error). The
// write is undone: the key is as it was before it. This package's message;
// the service documents none for it.
const MsgPersistFailed = "the state store could not write the key to its data directory"

// ErrDataDirInUse is returned by Start when another store process (or
// Server) has the data directory open.
var ErrDataDirInUse = errors.New("localstore: the data directory is in use by another store")

// dataFile is the name of the engine's file in Config.DataDir.
const dataFile = "statestore.db"

// Buckets and meta keys of the data file.
var (
	bucketKeys = []byte("keys") // sha256(key) -> record (see encodeRecord)
	bucketMeta = []byte("meta")
	metaFormat = []byte("format")
	metaHWM    = []byte("hwm") // big-endian int64: no version issued has a larger wall (ms)
	formatV1   = []byte("dsslock-localstore-1")
)

// hwmLead is how far ahead of the wall clock the persisted high-water mark
// of versions is set, so that it is rewritten about twice a second while
// versions are issued, never once per request.
const hwmLead = time.Second

// batch is a group of writes committed to disk in one transaction; its
// done channel closes once they are durable, or failed (err).
type batch struct {
	ops  []diskOp
	done chan struct{}
	err  error // set before done closes
	// undone holds the ids of the keys put back as they were when the
	// batch failed (set with err by persister.fail; nil otherwise).
	undone map[[sha256.Size]byte]struct{}
}

// failedFor reports whether the answer to a request on key, executed
// while b was pending, must be MsgPersistFailed: b failed and undid a
// write of key (the request's own, or one it saw), or failed without
// undoing anything (the store closed). A request on another key stands:
// nothing undid what it did or read.
func (b *batch) failedFor(key string) bool {
	if b.err == nil {
		return false
	}
	if b.undone == nil {
		return true
	}
	_, ok := b.undone[sha256.Sum256([]byte(key))]
	return ok
}

func newBatch() *batch { return &batch{done: make(chan struct{})} }

func (b *batch) finished() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// diskOp is one key's change on disk: its record, or nil to delete it, and
// the key as it was in memory before, to undo the change should the commit
// fail.
type diskOp struct {
	id     [sha256.Size]byte
	record []byte
	undo   keyState
}

// keyState is a key as it was in memory.
type keyState struct {
	key       []byte
	present   bool
	value     []byte
	version   hlc.Timestamp
	owner     string
	fence     hlc.Timestamp
	deadline  int64
	persisted bool
}

// persister writes persisted keys to the engine (bbolt) in group commits:
// requests executed under the store's lock queue their changes in the open
// batch; one goroutine commits whatever is queued in one synced transaction,
// while the next batch fills.
type persister struct {
	db   *bolt.DB
	dir  string
	log  *slog.Logger
	wall func() time.Time // the HLC's wall clock

	mu       sync.Mutex
	closed   bool   // close has committed the last batch: open is a finished one
	open     *batch // collecting
	inflight *batch // being committed; nil when none
	hwm      atomic.Int64
	issued   func() int64    // the wall of the last version issued
	storeMu  *sync.Mutex     // the store's lock, which undo needs
	undo     func(*keyState) // puts a key back as it was; called with storeMu held

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
}

// openPersister opens (creating) the data file in dir and loads it with
// load, called for every key whose deadline has not passed; keys whose
// deadline passed while the store was down are deleted. It fails, never
// starting empty, on a directory it cannot write, a file that is not a
// store's or is corrupt, or a file another store has open.
func openPersister(dir string, log *slog.Logger, wall func() time.Time, load func(r diskRecord) error) (p *persister, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("localstore: data directory: %w", err)
	}
	// A probe, so that a read-only directory fails here, with its name,
	// and not at the first write.
	probe, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return nil, fmt.Errorf("localstore: data directory %s is not writable: %w", dir, err)
	}
	_ = probe.Close()
	_ = os.Remove(probe.Name())

	// A corrupt file makes bbolt panic when it reads a bad page, or fault
	// when it reads past the end of a truncated one through its memory
	// map: here, loading, that is a failed start with the file named, not
	// a crash. (Faults become panics only on this goroutine, which opens
	// and loads the file.)
	path := filepath.Join(dir, dataFile)
	if err := createDataFile(path); err != nil {
		return nil, err
	}
	var db *bolt.DB
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			p, err = nil, fmt.Errorf("localstore: %s is corrupt: %v (move it away to start empty)", path, r)
		}
		if err != nil && db != nil {
			_ = db.Close() // releases its lock on the file
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: 200 * time.Millisecond, FreelistType: bolt.FreelistMapType})
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return nil, fmt.Errorf("%w: %s is locked", ErrDataDirInUse, path)
	case err != nil:
		return nil, fmt.Errorf("localstore: opening %s: %w (a corrupt or foreign file: move it away to start empty)", path, err)
	}
	var hwm int64
	err = db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			if k, _ := tx.Cursor().First(); k != nil {
				return errors.New("not a state store data file")
			}
			var err error
			if meta, err = tx.CreateBucket(bucketMeta); err != nil {
				return err
			}
			if _, err := tx.CreateBucket(bucketKeys); err != nil {
				return err
			}
			return meta.Put(metaFormat, formatV1)
		}
		if f := meta.Get(metaFormat); !bytes.Equal(f, formatV1) {
			return fmt.Errorf("unknown format %q", f)
		}
		if v := meta.Get(metaHWM); v != nil {
			if len(v) != 8 {
				return errors.New("corrupt high-water mark of versions")
			}
			hwm = int64(binary.BigEndian.Uint64(v))
		}
		keys := tx.Bucket(bucketKeys)
		if keys == nil {
			return errors.New("no key bucket")
		}
		now := time.Now().UnixNano()
		var expired [][]byte
		err := keys.ForEach(func(k, v []byte) error {
			r, err := decodeRecord(v)
			if err != nil {
				return fmt.Errorf("record %x: %w", k, err)
			}
			if sum := sha256.Sum256(r.key); !bytes.Equal(sum[:], k) {
				return fmt.Errorf("record %x: its key does not match its id", k)
			}
			if r.version.Wall > hwm {
				hwm = r.version.Wall
			}
			if r.deadline != 0 && r.deadline <= now {
				expired = append(expired, k)
				return nil
			}
			return load(r)
		})
		if err != nil {
			return err
		}
		for _, k := range expired {
			if err := keys.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("localstore: loading %s: %w", path, err)
	}
	p = &persister{
		db:   db,
		dir:  dir,
		log:  log,
		wall: wall,
		open: newBatch(),
		kick: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	p.hwm.Store(hwm)
	return p, nil
}

// createDataFile makes a new, empty data file at path if there is none:
// under another name, renamed into place once bbolt has written and synced
// it. So a file at path is one the store finished creating, and an empty
// one there is damage (a truncation, a failed copy), which fails the
// start: bbolt would take it for a new database, and the store would
// start empty.
func createDataFile(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.Size() == 0:
		return fmt.Errorf("localstore: %s is empty: truncated? (move it away to start empty)", path)
	case err == nil:
		return nil
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("localstore: %w", err)
	}
	tmp := path + ".new"
	_ = os.Remove(tmp) // left by a store that died creating it
	// Two stores started at once on a new directory race here: the one
	// whose file another removed or holds fails as a second store would.
	db, err := bolt.Open(tmp, 0o600, &bolt.Options{Timeout: 200 * time.Millisecond})
	switch {
	case errors.Is(err, bolterrors.ErrTimeout):
		return fmt.Errorf("%w: another store is creating %s", ErrDataDirInUse, path)
	case err != nil:
		return fmt.Errorf("localstore: creating %s: %w", tmp, err)
	}
	if err := db.Close(); err != nil {
		return fmt.Errorf("localstore: creating %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: another store is creating %s", ErrDataDirInUse, path)
	} else if err != nil {
		return fmt.Errorf("localstore: creating %s: %w", path, err)
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("localstore: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("localstore: syncing %s: %w", filepath.Dir(path), err)
	}
	return nil
}

// start runs the committer.
func (p *persister) start() { go p.run() }

// add queues op in the open batch and returns the batch. The caller holds
// the store's lock, so ops queue in the order they were executed.
func (p *persister) add(op diskOp) *batch {
	p.mu.Lock()
	b := p.open
	if !p.closed { // else b failed with errStoreClosed
		b.ops = append(b.ops, op)
	}
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
	return b
}

// pending returns the newest batch not yet durable, nil when everything
// queued is: a request that read the store's state may have seen its
// writes, and is answered only once they are durable.
func (p *persister) pending() *batch {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.open.ops) > 0 {
		return p.open
	}
	return p.inflight
}

// run commits batches until stop, then commits what is left.
func (p *persister) run() {
	defer close(p.done)
	tick := time.NewTicker(hwmLead / 4)
	defer tick.Stop()
	for {
		select {
		case <-p.kick:
		case <-tick.C:
		case <-p.stop:
			p.commit()
			return
		}
		p.commit()
	}
}

// commit writes the open batch, and a new high-water mark of versions if
// the clock nears the one on disk, in one synced transaction.
func (p *persister) commit() {
	p.mu.Lock()
	var b *batch
	if len(p.open.ops) > 0 {
		b = p.open
		p.open = newBatch()
		p.inflight = b
	}
	p.mu.Unlock()
	hwm := p.nextHWM()
	if b == nil && hwm == 0 {
		return
	}
	err := p.db.Update(func(tx *bolt.Tx) error {
		if b != nil {
			keys := tx.Bucket(bucketKeys)
			for i := range b.ops {
				op := &b.ops[i]
				var err error
				if op.record == nil {
					err = keys.Delete(op.id[:])
				} else {
					err = keys.Put(op.id[:], op.record)
				}
				if err != nil {
					return err
				}
			}
		}
		if hwm != 0 {
			return putHWM(tx, hwm)
		}
		return nil
	})
	if err == nil && hwm != 0 {
		p.storeHWM(hwm)
	}
	if b == nil {
		if err != nil {
			p.log.Warn("could not write the high-water mark of versions", "dir", p.dir, "error", err)
		}
		return
	}
	if err != nil {
		p.log.Error("persisted writes failed: undone, and answered with an error", "dir", p.dir, "writes", len(b.ops), "error", err)
		p.fail(b, err)
		return
	}
	p.mu.Lock()
	p.inflight = nil
	p.mu.Unlock()
	close(b.done)
}

// fail undoes the writes of b and of every write queued after it (they
// were executed on top of b's), most recent first, and ends them with err:
// the requests on the keys undone are answered with MsgPersistFailed;
// those on other keys that waited for b, as they were executed.
func (p *persister) fail(b *batch, err error) {
	p.storeMu.Lock()
	defer p.storeMu.Unlock()
	p.mu.Lock()
	later := p.open
	p.open = newBatch()
	p.inflight = nil
	p.mu.Unlock()
	undone := make(map[[sha256.Size]byte]struct{}, len(b.ops)+len(later.ops))
	for i := len(later.ops) - 1; i >= 0; i-- {
		p.undo(&later.ops[i].undo)
		undone[later.ops[i].id] = struct{}{}
	}
	for i := len(b.ops) - 1; i >= 0; i-- {
		p.undo(&b.ops[i].undo)
		undone[b.ops[i].id] = struct{}{}
	}
	b.err, later.err = err, err
	b.undone, later.undone = undone, undone
	close(b.done)
	close(later.done)
}

// nextHWM returns the high-water mark of versions to write now, 0 for none.
// While versions are issued (the clock's last is within half of hwmLead of
// the mark on disk), the mark moves to the wall clock plus hwmLead, or the
// last version if that is ahead; never back, and not for nothing.
func (p *persister) nextHWM() int64 {
	cur := p.hwm.Load()
	last := p.issued()
	next := max(last, p.wall().UnixMilli()+hwmLead.Milliseconds())
	if last <= cur-hwmLead.Milliseconds()/2 || next <= cur {
		return 0
	}
	return next
}

// raiseHWM makes the high-water mark of versions at least wall, durably,
// before a version with that wall is issued. The caller holds the store's
// lock: this happens only when a request's __ts moved the clock past the
// mark, or on the first version after an idle spell.
func (p *persister) raiseHWM(wall int64) error {
	if wall <= p.hwm.Load() {
		return nil
	}
	next := max(wall, p.wall().UnixMilli()+hwmLead.Milliseconds())
	err := p.db.Update(func(tx *bolt.Tx) error { return putHWM(tx, next) })
	if err != nil {
		return fmt.Errorf("localstore: writing the high-water mark of versions: %w", err)
	}
	p.storeHWM(next)
	return nil
}

// putHWM writes the high-water mark of versions hwm, unless the one on disk
// is higher: the committer and raiseHWM both write it, and it never goes
// back.
func putHWM(tx *bolt.Tx, hwm int64) error {
	meta := tx.Bucket(bucketMeta)
	if v := meta.Get(metaHWM); len(v) == 8 && int64(binary.BigEndian.Uint64(v)) >= hwm {
		return nil
	}
	return meta.Put(metaHWM, binary.BigEndian.AppendUint64(nil, uint64(hwm)))
}

// storeHWM records that the mark on disk is at least hwm.
func (p *persister) storeHWM(hwm int64) {
	for {
		cur := p.hwm.Load()
		if hwm <= cur || p.hwm.CompareAndSwap(cur, hwm) {
			return
		}
	}
}

// errStoreClosed fails the writes of requests executed as the store closed,
// after its last commit.
var errStoreClosed = errors.New("localstore: the store closed")

// close commits what is queued and closes the engine. A write queued after
// that (a request the broker was still executing) fails, so that no
// answer waits for ever.
func (p *persister) close() error {
	close(p.stop)
	<-p.done
	p.mu.Lock()
	p.closed = true
	last := p.open
	p.open = newBatch()
	p.open.err = errStoreClosed
	close(p.open.done)
	p.mu.Unlock()
	if len(last.ops) > 0 {
		last.err = errStoreClosed
	}
	close(last.done)
	return p.db.Close()
}

// diskRecord is one persisted key as it is on disk.
type diskRecord struct {
	key, value []byte
	version    hlc.Timestamp // Node is not stored: it is the store's
	deadline   int64         // wall clock, Unix nanoseconds; 0: none
	fence      hlc.Timestamp // zero: none
	owner      string
}

const recordV1 = 1

// encodeRecord lays r out as: format byte, version wall (8) and counter
// (4), deadline (8), fence flag (1) [fence wall (8), counter (4), node
// (uvarint length, bytes)], owner (uvarint length, bytes), key (uvarint
// length, bytes), value, and a CRC-32C of all that (4): bbolt checks its
// meta pages, not its data pages, and a flipped bit in a value must fail
// the store's start rather than come back as the key's value. Integers
// are big-endian.
func encodeRecord(r diskRecord) []byte {
	n := 1 + 12 + 8 + 1 + 3*binary.MaxVarintLen64 + len(r.owner) + len(r.key) + len(r.value) + 4
	if !r.fence.IsZero() {
		n += 12 + len(r.fence.Node)
	}
	b := make([]byte, 0, n)
	b = append(b, recordV1)
	b = binary.BigEndian.AppendUint64(b, uint64(r.version.Wall))
	b = binary.BigEndian.AppendUint32(b, r.version.Counter)
	b = binary.BigEndian.AppendUint64(b, uint64(r.deadline))
	if r.fence.IsZero() {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		b = binary.BigEndian.AppendUint64(b, uint64(r.fence.Wall))
		b = binary.BigEndian.AppendUint32(b, r.fence.Counter)
		b = binary.AppendUvarint(b, uint64(len(r.fence.Node)))
		b = append(b, r.fence.Node...)
	}
	b = binary.AppendUvarint(b, uint64(len(r.owner)))
	b = append(b, r.owner...)
	b = binary.AppendUvarint(b, uint64(len(r.key)))
	b = append(b, r.key...)
	b = append(b, r.value...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var errBadRecord = errors.New("malformed record")

// decodeRecord parses what encodeRecord wrote; the slices alias b.
func decodeRecord(b []byte) (diskRecord, error) {
	var r diskRecord
	if len(b) < 1+12+8+1+4 || b[0] != recordV1 {
		return r, errBadRecord
	}
	sum := binary.BigEndian.Uint32(b[len(b)-4:])
	if b = b[:len(b)-4]; crc32.Checksum(b, castagnoli) != sum {
		return r, errors.New("checksum mismatch")
	}
	r.version.Wall = int64(binary.BigEndian.Uint64(b[1:]))
	r.version.Counter = binary.BigEndian.Uint32(b[9:])
	r.deadline = int64(binary.BigEndian.Uint64(b[13:]))
	fenced := b[21]
	b = b[22:]
	if r.version.Wall < 0 || r.version.Counter > hlc.MaxCounter || r.deadline < 0 || fenced > 1 {
		return r, errBadRecord
	}
	bytesOf := func() ([]byte, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, false
		}
		s := b[k : k+int(n)]
		b = b[k+int(n):]
		return s, true
	}
	if fenced == 1 {
		if len(b) < 12 {
			return r, errBadRecord
		}
		r.fence.Wall = int64(binary.BigEndian.Uint64(b))
		r.fence.Counter = binary.BigEndian.Uint32(b[8:])
		b = b[12:]
		node, ok := bytesOf()
		if !ok {
			return r, errBadRecord
		}
		r.fence.Node = string(node)
		if r.fence.Validate() != nil {
			return r, errBadRecord
		}
	}
	owner, ok := bytesOf()
	if !ok {
		return r, errBadRecord
	}
	r.owner = string(owner)
	key, ok := bytesOf()
	if !ok || len(key) == 0 {
		return r, errBadRecord
	}
	r.key, r.value = key, b
	return r, nil
}
