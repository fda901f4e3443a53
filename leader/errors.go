package leader

import (
	"fmt"
	"strings"

	"github.com/dsslock/dsslock/lock"
)

// Errors of package leader. A term is a holding of a [lock.Lock] on the
// election's key, so these are the same values as their lock counterparts,
// and the reasons a term is lost are lock's: lock.ErrRenewDeadline,
// lock.ErrHeldByOther, lock.ErrFenced, lock.ErrClosed.
var (
	// ErrLost is wrapped by [Term.Err] when leadership was lost.
	ErrLost = lock.ErrLost
	// ErrResigned is [Term.Err] after Resign.
	ErrResigned = lock.ErrReleased
	// ErrConfig is wrapped by every error about invalid options.
	ErrConfig = lock.ErrConfig
)

// electionError adds the election's name, and the operation, to err.
type electionError struct {
	election, op string
	err          error
}

func (e *electionError) Error() string {
	// The lock's errors name the key again: say it once.
	msg := strings.TrimPrefix(e.err.Error(), fmt.Sprintf("lock %q: ", e.election))
	return fmt.Sprintf("leader %q: %s: %s", e.election, e.op, msg)
}

func (e *electionError) Unwrap() error { return e.err }
