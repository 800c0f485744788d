// Command argohealth runs an Argo CD resource health script the way Argo CD does: in
// gopher-lua (the Lua 5.1 engine Argo CD embeds), with the object as the global `obj`,
// the script returning a table with `status` and `message`.
//
//	argohealth SCRIPT.lua OBJECT.(json|yaml)...
//
// prints one JSON line {"status": ..., "message": ...} per object, in order. An object
// file may hold one object or a YAML list of them. Exit status 1 when a script fails.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	lua "github.com/yuin/gopher-lua"
	"sigs.k8s.io/yaml"
)

type health struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: argohealth SCRIPT.lua OBJECT...")
		os.Exit(2)
	}
	script, err := os.ReadFile(os.Args[1])
	if err != nil {
		fail(err)
	}
	out := json.NewEncoder(os.Stdout)
	for _, path := range os.Args[2:] {
		raw, err := os.ReadFile(path)
		if err != nil {
			fail(err)
		}
		var decoded any
		if err := yaml.Unmarshal(raw, &decoded); err != nil {
			fail(fmt.Errorf("%s: %w", path, err))
		}
		objects, ok := decoded.([]any)
		if !ok {
			objects = []any{decoded}
		}
		for _, object := range objects {
			result, err := run(string(script), object)
			if err != nil {
				fail(fmt.Errorf("%s: %w", path, err))
			}
			if err := out.Encode(result); err != nil {
				fail(err)
			}
		}
	}
}

// run evaluates the script in a fresh state with only the libraries a health script may
// use (no io, os, package or debug), as Argo CD's sandbox gives it.
func run(script string, object any) (health, error) {
	state := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer state.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.StringLibName, lua.OpenString},
		{lua.MathLibName, lua.OpenMath},
	} {
		state.Push(state.NewFunction(lib.open))
		state.Push(lua.LString(lib.name))
		state.Call(1, 0)
	}
	state.SetGlobal("obj", toLua(state, object))
	if err := state.DoString(script); err != nil {
		return health{}, err
	}
	returned, ok := state.Get(-1).(*lua.LTable)
	if !ok {
		return health{}, fmt.Errorf("the script returned %s, not a table", state.Get(-1).Type())
	}
	return health{
		Status:  lua.LVAsString(returned.RawGetString("status")),
		Message: lua.LVAsString(returned.RawGetString("message")),
	}, nil
}

// toLua turns decoded JSON into Lua values: objects and arrays into tables (arrays from
// index 1), numbers, strings and booleans as themselves, null as nil.
func toLua(state *lua.LState, value any) lua.LValue {
	switch v := value.(type) {
	case map[string]any:
		table := state.NewTable()
		for key, item := range v {
			table.RawSetString(key, toLua(state, item))
		}
		return table
	case []any:
		table := state.NewTable()
		for _, item := range v {
			table.Append(toLua(state, item))
		}
		return table
	case string:
		return lua.LString(v)
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case nil:
		return lua.LNil
	default:
		return lua.LString(fmt.Sprint(v))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "argohealth:", err)
	os.Exit(1)
}
