//go:build race

package interop

// raceEnabled: the tests run under -race, so the store is built with it too.
const raceEnabled = true
