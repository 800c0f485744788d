// rulecheck parses Prometheus rule files exactly as Prometheus does (rulefmt, with the
// PromQL parser), for the chart's PrometheusRule: `rulecheck FILE...` prints each file's
// errors and exits 1 if there are any. promtool does the same, but comes with every
// service-discovery plugin; this needs only the rule format. With -metrics first, it also
// prints "metric: NAME" for every metric name a rule's expression selects, as the parser
// reads it, so a test can check each one is exported.
package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: rulecheck FILE...")
		os.Exit(2)
	}
	metrics := false
	if os.Args[1] == "-metrics" {
		metrics = true
		os.Args = os.Args[1:]
	}
	failed := false
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	promql := parser.NewParser(parser.Options{})
	for _, path := range os.Args[1:] {
		groups, errs := rulefmt.ParseFile(path, false, model.UTF8Validation, promql, logger)
		for _, err := range errs {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			failed = true
		}
		if groups != nil {
			rules := 0
			for _, group := range groups.Groups {
				rules += len(group.Rules)
				if !metrics {
					continue
				}
				for _, rule := range group.Rules {
					expr, err := promql.ParseExpr(rule.Expr)
					if err != nil {
						continue // rulefmt has reported it
					}
					parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
						if selector, ok := node.(*parser.VectorSelector); ok && selector.Name != "" {
							fmt.Printf("metric: %s\n", selector.Name)
						}
						return nil
					})
				}
			}
			fmt.Printf("%s: %d groups, %d rules\n", path, len(groups.Groups), rules)
		}
	}
	if failed {
		os.Exit(1)
	}
}
