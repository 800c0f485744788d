package promqleval

import (
	"flag"
	"os"
	"testing"

	"github.com/prometheus/prometheus/promql/promqltest"
)

func TestScripts(t *testing.T) {
	scripts := flag.Args()
	if len(scripts) == 0 {
		t.Fatal("usage: promqleval -test.run TestScripts -- SCRIPT...")
	}
	for _, path := range scripts {
		t.Run(path, func(t *testing.T) {
			script, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
			promqltest.RunTest(t, string(script), engine)
		})
	}
}
