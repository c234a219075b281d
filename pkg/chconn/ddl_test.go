package chconn_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2"

	"kurz.dev/pkg/chconn"
)

func TestQueuedForDownServersOnlyWhenEveryUnfinishedServerIsDown(t *testing.T) {
	timeout := func(msg string) error {
		return fmt.Errorf("exec: %w", &clickhouse.Exception{Code: 159, Message: msg})
	}
	tests := map[string]struct {
		err  error
		want bool
	}{
		"18.16, the unfinished server down": {timeout("Watching task /clickhouse/task_queue/ddl/query-0000000119 is executing " +
			"longer than distributed_ddl_task_timeout (=5) seconds. There are 1 unfinished hosts (0 of them are currently active), " +
			"they are going to execute the query in background"), true},
		"18.16, an unfinished server up": {timeout("Watching task /clickhouse/task_queue/ddl/query-0000000119 is executing " +
			"longer than distributed_ddl_task_timeout (=5) seconds. There are 2 unfinished hosts (1 of them are currently active), " +
			"they are going to execute the query in background"), false},
		"24.x, the unfinished servers down": {timeout("Distributed DDL task /clickhouse/task_queue/ddl/query-0000000007 is not " +
			"finished on 2 of 4 hosts (0 of them are currently executing the task, 2 are inactive). They are going to execute " +
			"the query in background. Was waiting for 10.0 seconds"), true},
		"24.x, an unfinished server up": {timeout("Distributed DDL task /clickhouse/task_queue/ddl/query-0000000007 is not " +
			"finished on 2 of 4 hosts (0 of them are currently executing the task, 1 are inactive). They are going to execute " +
			"the query in background. Was waiting for 10.0 seconds"), false},
		"a query's time limit": {timeout("Timeout exceeded: elapsed 5.1 seconds, maximum: 5"), false},
		"another exception":    {&clickhouse.Exception{Code: 60, Message: "Table kurz.x doesn't exist."}, false},
		"not an exception":     {errors.New("connection refused"), false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := chconn.QueuedForDownServers(tc.err); got != tc.want {
				t.Errorf("QueuedForDownServers(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
