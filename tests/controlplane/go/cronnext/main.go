// Command cronnext prints the ticks Kubernetes' CronJob controller computes: the schedule
// as the controller formats it (`TZ=<spec.timeZone>` prefixed unless the schedule names a
// zone), parsed by robfig/cron's ParseStandard with the controller's panic recovery, then
// SpecSchedule.Next (or @every's) stepped from `after`, in UTC as the controller runs.
//
//	cronnext <REQUESTS.jsonl
//
// Each input line is {"schedule": S, "tz": Z or null, "after": RFC3339, "count": N}; each
// output line is {"ticks": [RFC3339...]} (fewer than N when Next gives the zero time) or
// {"error": "..."} when the controller would not schedule it.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

type request struct {
	Schedule string  `json:"schedule"`
	TZ       *string `json:"tz"`
	After    string  `json:"after"`
	Count    int     `json:"count"`
}

type answer struct {
	Ticks []string `json:"ticks"`
	Error string   `json:"error,omitempty"`
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			fmt.Fprintln(os.Stderr, "cronnext:", err)
			os.Exit(2)
		}
		if err := out.Encode(ticks(req)); err != nil {
			fmt.Fprintln(os.Stderr, "cronnext:", err)
			os.Exit(1)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "cronnext:", err)
		os.Exit(1)
	}
}

func ticks(req request) answer {
	after, err := time.Parse(time.RFC3339Nano, req.After)
	if err != nil {
		return answer{Error: err.Error()}
	}
	spec := req.Schedule
	// formatSchedule and syncCronJob in pkg/controller/cronjob.
	if !strings.Contains(spec, "TZ") && req.TZ != nil {
		if _, err := time.LoadLocation(*req.TZ); err != nil {
			return answer{Error: err.Error()}
		}
		spec = fmt.Sprintf("TZ=%s %s", *req.TZ, spec)
	}
	schedule, err := parse(spec)
	if err != nil {
		return answer{Error: err.Error()}
	}
	result := answer{Ticks: []string{}}
	t := after.UTC()
	for len(result.Ticks) < req.Count {
		t = schedule.Next(t)
		if t.IsZero() {
			break
		}
		result.Ticks = append(result.Ticks, t.UTC().Format(time.RFC3339Nano))
	}
	return result
}

// parse is pkg/util/parsers' ParseCronScheduleWithPanicRecovery.
func parse(spec string) (schedule cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			schedule = nil
			err = fmt.Errorf("invalid schedule format: %v", r)
		}
	}()
	return cron.ParseStandard(spec)
}
