package main

// The one-shot commands offer only the configuration keys they use
// (config.KeysFor). This test follows their code to see which keys it
// reads: it type-checks this package and the packages that hand the
// configuration on (protocols, canary, soak, daemon) from source, every
// other package from the compiler's export data, walks every function
// reachable from runCanary and runSoak within them, and collects the
// fields of the configuration they select. A key read but not offered fails
// the test: a user could set it only through the file or the environment,
// and help would not show it.

import (
	"encoding/json"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/imcanary/imcanary/config"
	"github.com/imcanary/imcanary/protocols"
)

const (
	modulePath = "github.com/imcanary/imcanary"
	configPath = modulePath + "/config"
)

// sourcePackages are the packages read from source, in the order of their
// imports: the ones that take a config.Config and pass parts of it on.
var sourcePackages = []string{"protocols", "canary", "soak", "daemon"}

func TestCommandsOfferTheKeysTheyRead(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks five packages; skipped with -short")
	}
	a := newKeyUse(t)
	for _, tt := range []struct {
		fn   string
		cmd  config.Command
		some []string // read for sure: the analysis must see them
	}{
		{"runCanary", config.CommandCanary, []string{"canary.users", "canary.deadline", "target.url", "population.heartbeat", "data_dir"}},
		{"runSoak", config.CommandSoak, []string{"history.max_runs", "population.message_size", "target.url", "saturation.window"}},
		{"runJSONWS", config.CommandJSONWS, []string{"target.url", "target.protocol"}},
		{"runDaemon", config.CommandRun, []string{"http.listen", "canary.schedule", "canary.jitter", "population.users", "shard"}},
	} {
		t.Run(tt.fn, func(t *testing.T) {
			read := a.keysReadFrom(tt.fn)
			for _, k := range tt.some {
				if !read[k] {
					t.Errorf("%s reads %s, but the analysis did not see it: the test is broken", tt.fn, k)
				}
			}
			offered := protocols.Loader().KeysFor(tt.cmd)
			for _, k := range slices.Sorted(mapKeys(read)) {
				if !slices.Contains(offered, k) {
					t.Errorf("%s reads %s, which config.KeysFor does not offer: add the command to the key's uses in config/keys.go", tt.fn, k)
				}
			}
			t.Logf("%s reads %d keys of the %d it offers", tt.fn, len(read), len(offered))
		})
	}
}

func mapKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// keyUse is the packages read from source, type-checked, and what is known of the
// configuration's types.
type keyUse struct {
	info  *types.Info
	funcs map[*types.Func]*ast.FuncDecl // functions and methods of those packages
	vars  map[*types.Var]ast.Expr       // their package-level variables' initialisers
	main  *types.Package
	// prefixes are the paths at which each struct type of package config
	// sits in config.Config ("" for Config itself); types only inside lists
	// (a soak profile, a header) have none, being no keys.
	prefixes map[*types.TypeName][]string
}

func newKeyUse(t *testing.T) *keyUse {
	t.Helper()
	// Export data of every dependency, as go build makes it.
	out, err := exec.Command("go", "list", "-deps", "-export", "-json=ImportPath,Export,Dir,GoFiles", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	type pkg struct{ ImportPath, Export, Dir string }
	exports := map[string]string{}
	dirs := map[string]pkg{}
	files := map[string][]string{}
	for dec := json.NewDecoder(strings.NewReader(string(out))); dec.More(); {
		var p struct {
			pkg
			GoFiles []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		exports[p.ImportPath] = p.Export
		dirs[p.ImportPath] = p.pkg
		files[p.ImportPath] = p.GoFiles
	}
	fset := token.NewFileSet()
	a := &keyUse{
		info: &types.Info{
			Uses: map[*ast.Ident]types.Object{}, Defs: map[*ast.Ident]types.Object{},
			Selections: map[*ast.SelectorExpr]*types.Selection{}, Types: map[ast.Expr]types.TypeAndValue{},
		},
		funcs:    map[*types.Func]*ast.FuncDecl{},
		vars:     map[*types.Var]ast.Expr{},
		prefixes: map[*types.TypeName][]string{},
	}
	gc := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		return os.Open(exports[path])
	}).(types.ImporterFrom)
	checked := map[string]*types.Package{}
	imp := importerFunc(func(path string) (*types.Package, error) {
		if p, ok := checked[path]; ok {
			return p, nil
		}
		return gc.ImportFrom(path, "", 0)
	})
	check := func(path string) *types.Package {
		var syntax []*ast.File
		for _, f := range files[path] {
			af, err := parser.ParseFile(fset, filepath.Join(dirs[path].Dir, f), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			syntax = append(syntax, af)
		}
		p, err := (&types.Config{Importer: imp}).Check(path, fset, syntax, a.info)
		if err != nil {
			t.Fatalf("type-check %s: %v", path, err)
		}
		checked[path] = p
		for _, f := range syntax {
			for _, d := range f.Decls {
				switch d := d.(type) {
				case *ast.FuncDecl:
					a.funcs[a.info.Defs[d.Name].(*types.Func)] = d
				case *ast.GenDecl:
					for _, s := range d.Specs {
						if vs, ok := s.(*ast.ValueSpec); ok {
							for i, n := range vs.Names {
								if v, ok := a.info.Defs[n].(*types.Var); ok && i < len(vs.Values) {
									a.vars[v] = vs.Values[i]
								}
							}
						}
					}
				}
			}
		}
		return p
	}
	for _, p := range sourcePackages {
		check(modulePath + "/" + p)
	}
	a.main = check(modulePath + "/cmd/imcanary")
	cfgPkg, err := imp.Import(configPath)
	if err != nil {
		t.Fatal(err)
	}
	a.walkType(cfgPkg.Scope().Lookup("Config").(*types.TypeName), "")
	return a
}

// walkType records the path of the struct type tn and of the sections
// inside it.
func (a *keyUse) walkType(tn *types.TypeName, prefix string) {
	a.prefixes[tn] = append(a.prefixes[tn], prefix)
	st := tn.Type().Underlying().(*types.Struct)
	for i := range st.NumFields() {
		if sub, ok := section(st.Field(i).Type()); ok {
			a.walkType(sub, joinKey(prefix, koanfTag(st, i)))
		}
	}
}

// section returns the type name of t if it is a struct type of package
// config (a section of keys).
func section(t types.Type) (*types.TypeName, bool) {
	n, ok := types.Unalias(t).(*types.Named)
	if !ok || n.Obj().Pkg() == nil || n.Obj().Pkg().Path() != configPath {
		return nil, false
	}
	_, isStruct := n.Underlying().(*types.Struct)
	return n.Obj(), isStruct
}

func koanfTag(st *types.Struct, i int) string {
	tag, _, _ := strings.Cut(reflect.StructTag(st.Tag(i)).Get("koanf"), ",")
	return tag
}

func joinKey(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// keysReadFrom returns the keys read by the function of package main
// named fn and everything it reaches in the packages read from source.
func (a *keyUse) keysReadFrom(fn string) map[string]bool {
	read := map[string]bool{}
	seen := map[ast.Node]bool{}
	var queue []ast.Node
	push := func(n ast.Node) {
		if n != nil && !seen[n] {
			seen[n] = true
			queue = append(queue, n)
		}
	}
	pushFunc := func(f *types.Func) {
		if d := a.funcs[f]; d != nil {
			push(d)
		}
	}
	pushFunc(a.main.Scope().Lookup(fn).(*types.Func))
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		// Section-valued selections that are only a step to a field
		// (cfg.Population.Users) or are given a local name (p :=
		// cfg.Population, read field by field through its type): not a
		// read of the whole section.
		stepping := map[ast.Expr]bool{}
		// unkeyed are the local variables that hold a section reached
		// from no key (sr := profile.SlowReaders).
		unkeyed := map[*types.Var]bool{}
		ast.Inspect(n, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if s := a.info.Selections[n]; s != nil && s.Kind() == types.FieldVal {
					stepping[ast.Unparen(n.X)] = true
				}
			case *ast.AssignStmt:
				for i, r := range n.Rhs {
					stepping[ast.Unparen(r)] = true
					if id, ok := n.Lhs[min(i, len(n.Lhs)-1)].(*ast.Ident); ok && len(n.Lhs) == len(n.Rhs) && a.unkeyed(r, unkeyed) {
						v, _ := a.info.Defs[id].(*types.Var)
						if v == nil {
							v, _ = a.info.Uses[id].(*types.Var)
						}
						unkeyed[v] = true
					}
				}
			case *ast.ValueSpec:
				for _, r := range n.Values {
					stepping[ast.Unparen(r)] = true
				}
			}
			return true
		})
		ast.Inspect(n, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.Ident:
				switch obj := a.info.Uses[n].(type) {
				case *types.Func:
					pushFunc(obj.Origin())
				case *types.Var:
					if init, ok := a.vars[obj]; ok {
						push(init)
					}
				}
			case *ast.SelectorExpr:
				s := a.info.Selections[n]
				if s == nil || s.Kind() != types.FieldVal {
					break
				}
				recv, ok := section(derefType(s.Recv()))
				if !ok || a.unkeyed(n.X, unkeyed) {
					break
				}
				st := recv.Type().Underlying().(*types.Struct)
				field := s.Obj().(*types.Var)
				for i := range st.NumFields() {
					if st.Field(i) != field {
						continue
					}
					for _, p := range a.prefixes[recv] {
						key := joinKey(p, koanfTag(st, i))
						if sub, isSection := section(field.Type()); isSection {
							if !stepping[n] {
								a.allUnder(sub, key, read)
							}
						} else if protocols.Loader().EnvName(key) != "" {
							read[key] = true
						}
					}
				}
			case *ast.CallExpr:
				// A section handed to code outside those packages is
				// read whole, but for package config's own methods and
				// functions (Validate reads everything by design).
				callee := calleeOf(a.info, n)
				if callee == nil || callee.Pkg() == nil || a.funcs[callee] != nil || callee.Pkg().Path() == configPath {
					break
				}
				for _, arg := range n.Args {
					if tn, ok := section(a.info.TypeOf(arg)); ok {
						for _, p := range a.prefixes[tn] {
							a.allUnder(tn, p, read)
						}
					}
				}
			}
			return true
		})
	}
	return read
}

// unkeyed reports whether e, a section's value, is reached from a type
// that sits at no key (a soak profile, which only a list holds), directly
// or through one of the local variables in vars: the fields of its
// SlowReaders are a profile's, not population.slow_readers.
func (a *keyUse) unkeyed(e ast.Expr, vars map[*types.Var]bool) bool {
	switch e := ast.Unparen(e).(type) {
	case *ast.SelectorExpr:
		s := a.info.Selections[e]
		if s == nil || s.Kind() != types.FieldVal {
			return false
		}
		if recv, ok := section(derefType(s.Recv())); ok && len(a.prefixes[recv]) == 0 {
			return true
		}
		return a.unkeyed(e.X, vars)
	case *ast.Ident:
		v, _ := a.info.Uses[e].(*types.Var)
		return v != nil && vars[v]
	}
	return false
}

// allUnder marks every key under the section tn at prefix as read.
func (a *keyUse) allUnder(tn *types.TypeName, prefix string, read map[string]bool) {
	for _, k := range protocols.Loader().Keys() {
		if prefix == "" || k == prefix || strings.HasPrefix(k, prefix+".") {
			read[k] = true
		}
	}
}

func derefType(t types.Type) types.Type {
	if p, ok := types.Unalias(t).(*types.Pointer); ok {
		return p.Elem()
	}
	return t
}

// calleeOf returns the function or method a call calls, if it is named.
func calleeOf(info *types.Info, call *ast.CallExpr) *types.Func {
	switch f := ast.Unparen(call.Fun).(type) {
	case *ast.Ident:
		fn, _ := info.Uses[f].(*types.Func)
		return fn
	case *ast.SelectorExpr:
		fn, _ := info.Uses[f.Sel].(*types.Func)
		return fn
	}
	return nil
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }
