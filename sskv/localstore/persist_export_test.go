package localstore

import (
	"crypto/sha256"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/dsslock/dsslock/hlc"
)

// FillDataDir writes n persisted keys, "fill-<i>" with valueSize-byte
// values, to a new data directory dir, as a store in mode all would have
// left them, far faster than through SETs: for benchmarks of recovery.
func FillDataDir(dir string, n, valueSize int) error {
	p, err := openPersister(dir, nil, time.Now, func(diskRecord) error { return nil })
	if err != nil {
		return err
	}
	defer p.db.Close()
	wall := time.Now().UnixMilli()
	value := make([]byte, valueSize)
	for i := 0; i < n; {
		err := p.db.Update(func(tx *bolt.Tx) error {
			keys := tx.Bucket(bucketKeys)
			for end := min(i+50000, n); i < end; i++ {
				key := fmt.Appendf(nil, "fill-%09d", i)
				id := sha256.Sum256(key)
				r := diskRecord{key: key, value: value, version: hlc.Timestamp{Wall: wall, Counter: uint32(i)}}
				if err := keys.Put(id[:], encodeRecord(r)); err != nil {
					return err
				}
			}
			return putHWM(tx, wall)
		})
		if err != nil {
			return err
		}
	}
	return nil
}
