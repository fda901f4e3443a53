package lease

import (
	"context"

	"github.com/dsslock/dsslock/sskv"
)

// KeyWatch is a waiter's watch of the key, which a FenceKey holding takes
// over when the wait ends in an acquisition (see holding.guard). The zero
// KeyWatch is none. A Lock keeps it by value: a waiter's watch costs no
// allocation beside the watch itself.
type KeyWatch struct {
	W      *sskv.Watcher
	Cancel context.CancelFunc // ends the watch; nil for one of watchKey's
	Box    *Box               // where its events go, which a holding's guard takes over
}

// End ends the watch, if any: with cancel, or else (a watch of
// watchKey's) with a Stop in the background, so that the End does not wait
// for the client to unregister it.
func (ww KeyWatch) End() {
	switch {
	case ww.Cancel != nil:
		ww.Cancel()
	case ww.W != nil:
		go ww.W.Stop()
	}
}

// Ender returns a function that ends the watch, as end does.
func (ww KeyWatch) Ender() func() {
	if ww.Cancel != nil {
		return ww.Cancel
	}
	return func() { go ww.W.Stop() }
}
