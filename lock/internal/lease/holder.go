package lease

import (
	"bytes"

	"github.com/dsslock/dsslock/hlc"
)

// Holder is lock.Holder: see there. The two have the same fields.
type Holder struct {
	ID      string
	Token   hlc.Timestamp
	Value   []byte
	Version hlc.Timestamp
}

// SemaphoreRecordPrefix starts the value of a semaphore's record key, and
// RWRecordPrefix an RWMutex's: no lock's record.
const (
	SemaphoreRecordPrefix = "dsslock-semaphore limit="
	RWRecordPrefix        = "dsslock-rwmutex readers="
)

// ParseHolder is lock.ParseHolder: see there.
func ParseHolder(value []byte, version hlc.Timestamp) Holder {
	if value == nil {
		return Holder{}
	}
	id, rest, ok := bytes.Cut(value, []byte{'\n'})
	if !ok {
		return Holder{ID: string(value), Version: version}
	}
	tok, val, ok := bytes.Cut(rest, []byte{'\n'})
	if !ok {
		return Holder{ID: string(value), Version: version}
	}
	h := Holder{ID: string(id), Value: bytes.Clone(val), Version: version}
	if len(tok) > 0 && tok[0] != '~' {
		t, err := hlc.ParseBytes(tok)
		if err != nil {
			return Holder{ID: string(value), Version: version}
		}
		h.Token = t
	}
	return h
}
