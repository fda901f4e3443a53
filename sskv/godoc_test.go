package sskv_test

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// "go doc sskv.Condition" shows one line per const declaration of the type,
// with only the first name of a block: each condition is declared alone so
// that all of them are listed.
func TestConditionsListedByGoDoc(t *testing.T) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	p, err := doc.NewFromFiles(fset, files, "github.com/dsslock/dsslock/sskv")
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range p.Types {
		if typ.Name != "Condition" {
			continue
		}
		var shown []string
		for _, v := range typ.Consts {
			// go doc's one-line summary of a declaration names its first
			// constant only.
			shown = append(shown, v.Decl.Specs[0].(*ast.ValueSpec).Names[0].Name)
		}
		for _, want := range []string{"Always", "IfNotExists", "IfEqualOrNotExists"} {
			if !slices.Contains(shown, want) {
				t.Errorf("go doc sskv.Condition shows %v, not %s", shown, want)
			}
		}
		return
	}
	t.Fatal("no type Condition")
}
