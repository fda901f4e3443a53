package hlc_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/dsslock/dsslock/hlc"
)

func ExampleParse() {
	// Any width of digits is accepted; String writes the zero-padded form.
	t, err := hlc.Parse("1696374425000:1:StateStore")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(t.Wall, t.Counter, t.Node)
	fmt.Println(t)
	fmt.Println(t.Time().UTC())

	_, err = hlc.Parse("1696374425000:1")
	fmt.Println(errors.Is(err, hlc.ErrMalformed))
	// Output:
	// 1696374425000 1 StateStore
	// 001696374425000:00001:StateStore
	// 2023-10-03 23:07:05 +0000 UTC
	// true
}

func ExampleTimestamp_Compare() {
	request, _ := hlc.Parse("1696374425000:0:Client1")
	version, _ := hlc.Parse("1696374425000:1:StateStore")
	tie, _ := hlc.Parse("1696374425000:1:Client1")

	fmt.Println(request.Compare(version), version.Compare(request), version.Compare(version))
	// The counter orders timestamps with equal walls; the node id only
	// breaks remaining ties.
	fmt.Println(request.Before(version), tie.Before(version))
	// Output:
	// -1 1 0
	// true true
}

func ExampleClock_Update() {
	// A state store clock whose physical clock reads the protocol
	// document's example time and does not move.
	wall := time.UnixMilli(1696374425000)
	store, err := hlc.NewClock("StateStore", hlc.WithWallClock(func() time.Time { return wall }))
	if err != nil {
		fmt.Println(err)
		return
	}

	// A SET arrives with the client's timestamp: the new version is
	// strictly greater than it.
	request, _ := hlc.Parse("1696374425000:0:Client1")
	version, _ := store.Update(request)
	fmt.Println(version)

	// A client whose clock runs 2 s ahead: the store adopts its wall.
	version, _ = store.Update(hlc.Timestamp{Wall: 1696374427000, Counter: 4, Node: "Client2"})
	fmt.Println(version)

	// A client more than a minute ahead is rejected and the clock is
	// unchanged.
	_, err = store.Update(hlc.Timestamp{Wall: 1696374425000 + 61_000, Node: "Client3"})
	fmt.Println(errors.Is(err, hlc.ErrDrift), err)
	fmt.Println(store.Peek())

	// Local events keep counting while the physical clock lags.
	fmt.Println(store.Now())
	// Output:
	// 001696374425000:00001:StateStore
	// 001696374427000:00005:StateStore
	// true hlc: timestamp too far ahead of the wall clock: 1m1s ahead, more than the 1m0s allowed
	// 001696374427000:00005:StateStore
	// 001696374427000:00006:StateStore
}
