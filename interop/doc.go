// Package interop holds no library code. Its tests check that an unmodified
// official Azure IoT Operations Go SDK client (statestore and leasedlock)
// works against the dsslock local state store program
// (github.com/dsslock/dsslock/cmd/statestore), which the tests build and
// run as a subprocess. It is a separate module so that the official SDK never
// enters the dependencies of github.com/dsslock/dsslock. See README.md.
package interop
