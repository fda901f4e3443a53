package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// versionLine describes the running program: its module version (as go
// install module@version stamps it, or the version control state of a
// build from a clone) and the Go it was built with.
func versionLine(program string) string {
	version := "(unknown)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = bi.Main.Version
		if version == "" || version == "(devel)" {
			version = "(devel)"
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" && len(s.Value) >= 12 {
					version += " " + s.Value[:12]
				}
			}
		}
	}
	return fmt.Sprintf("%s %s (github.com/dsslock/dsslock, %s)", program, version, runtime.Version())
}
