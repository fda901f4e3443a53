package main

import (
	"context"
	"fmt"
	"io"

	"github.com/dsslock/dsslock/hlc"
	"github.com/dsslock/dsslock/sskv"
)

// Exit statuses.
func get(ctx context.Context, c *sskv.Client, key string, raw bool, stdout, stderr io.Writer) int {
	res, err := c.Get(ctx, key)
	if err != nil {
		return fail(stderr, err)
	}
	if !res.Found {
		fmt.Fprintln(stderr, "NOT FOUND") // stdout carries the value alone: a value may read NOT FOUND
		return exitNotMet
	}
	if raw {
		_, err = stdout.Write(res.Value)
	} else {
		_, err = fmt.Fprintf(stdout, "%s\n(version %s)\n", showValue(res.Value, false), res.Version)
	}
	if err != nil {
		return fail(stderr, err)
	}
	return exitOK
}

func set(ctx context.Context, c *sskv.Client, key string, value []byte, o *cmdOpts, stdout, stderr io.Writer) (int, error) {
	opts := sskv.SetOptions{Expiry: o.px, FencingToken: o.ft, Persist: o.persist}
	switch {
	case o.nx:
		opts.Condition = sskv.IfNotExists
	case o.nex:
		opts.Condition = sskv.IfEqualOrNotExists
	}
	res, err := c.Set(ctx, key, value, opts)
	if err != nil {
		return fail(stderr, err), err
	}
	if !res.Applied {
		fmt.Fprintf(stdout, "NOT APPLIED%s\n", currentVersion(res.Version))
		return exitNotMet, nil
	}
	fmt.Fprintf(stdout, "OK %s\n", res.Version)
	return exitOK, nil
}

func delOutcome(res sskv.DelResult, err error, stdout, stderr io.Writer) int {
	switch {
	case err != nil:
		return fail(stderr, err)
	case res.Deleted:
		fmt.Fprintf(stdout, "DELETED %s\n", res.Version)
		return exitOK
	case res.Mismatch:
		fmt.Fprintf(stdout, "VALUE DIFFERS%s\n", currentVersion(res.Version))
		return exitNotMet
	}
	fmt.Fprintln(stdout, "NOT FOUND")
	return exitNotMet
}

func currentVersion(v hlc.Timestamp) string {
	if v.IsZero() {
		return ""
	}
	return " (current version " + v.String() + ")"
}

// watch prints the events of keys until ctx ends or a watch fails.
