// Package clientlocal keeps values that live as long as an sskv.Client, for
// the module's own packages: package lock renews every lease taken through
// a client with one scheduler, kept here. It is what would otherwise be a
// registry in sskv.Client's public API.
package clientlocal

import "sync"

// Values holds at most one value per key. The zero Values is ready to use.
type Values struct {
	mu sync.Mutex
	m  map[any]any
}

// Get returns the value kept under key, calling create to make it the
// first time. Use a key of an unexported type, as with context values.
// create runs once per key, under a lock: it must not call Get.
func (v *Values) Get(key any, create func() any) any {
	v.mu.Lock()
	defer v.mu.Unlock()
	if x, ok := v.m[key]; ok {
		return x
	}
	if v.m == nil {
		v.m = make(map[any]any)
	}
	x := create()
	v.m[key] = x
	return x
}

// Of returns the Values of client, an *sskv.Client. Package sskv sets it
// when it is initialized, and nothing changes it after: it is how this
// package reaches a field that sskv does not export. It is nil in a
// program that does not link sskv, which then has no client to ask about.
var Of func(client any) *Values
