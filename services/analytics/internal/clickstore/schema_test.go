package clickstore

import (
	"strings"
	"testing"
)

func TestOneServerSchemaHasNoClusterClause(t *testing.T) {
	for _, d := range Schema(Layout{Database: "kurz"}) {
		if strings.Contains(d.Stmt, "ON CLUSTER") || strings.Contains(d.Stmt, "Replicated") || strings.Contains(d.Stmt, "Distributed") {
			t.Errorf("one server: %s", d.Stmt)
		}
	}
}

// On a cluster every per-server table is Replicated under its shard's
// ZooKeeper path, every statement runs ON CLUSTER, the views read and write
// the per-server tables, and only the raw table's Distributed table shards
// inserts, by link.
func TestClusterSchemaReplicatesAndShardsByLink(t *testing.T) {
	l := Layout{Database: "kurz", Cluster: "c1"}
	dist := map[string]string{}
	for _, d := range Schema(l) {
		if !strings.Contains(d.Stmt, " ON CLUSTER c1 ") {
			t.Errorf("%s: no ON CLUSTER c1", d.Object)
		}
		switch {
		case strings.HasSuffix(d.Object, LocalSuffix):
			want := "Replicated"
			if !strings.Contains(d.Stmt, want) || !strings.Contains(d.Stmt, "'/clickhouse/tables/{shard}/kurz/"+d.Object+"', '{replica}'") {
				t.Errorf("%s is not replicated under its shard's path: %s", d.Object, d.Stmt)
			}
		case strings.HasSuffix(d.Object, "_mv"):
			if !strings.Contains(d.Stmt, "TO kurz.click_") || !strings.Contains(d.Stmt, LocalSuffix+" AS") ||
				!strings.Contains(d.Stmt, "FROM kurz."+EventsTable+LocalSuffix) {
				t.Errorf("view %s does not go from and to per-server tables: %s", d.Object, d.Stmt)
			}
		default:
			dist[d.Object] = d.Stmt
		}
	}
	for _, table := range []string{EventsTable, HourlyTable, DimsTable, OwnersTable, SuspectsTable} {
		stmt, ok := dist[table]
		if !ok {
			t.Errorf("no Distributed %s", table)
			continue
		}
		want := "ENGINE = Distributed(c1, kurz, " + table + LocalSuffix
		if table == EventsTable {
			want += ", cityHash64(tenant, code))"
		}
		if !strings.Contains(stmt, want) {
			t.Errorf("%s: %s, want it to contain %q", table, stmt, want)
		}
	}
}

// Every column line of every table parses into a name and a declaration,
// which is what the upgrade path adds.
func TestDeclaredColumnsParse(t *testing.T) {
	for _, tb := range tables {
		lines := 0
		for line := range strings.Lines(tb.columns) {
			if strings.TrimSpace(line) != "" {
				lines++
			}
		}
		cols := tb.declared()
		if len(cols) != lines {
			t.Errorf("%s: %d columns parsed from %d lines", tb.name, len(cols), lines)
		}
		for _, c := range cols {
			if c.name == "" || c.decl == "" || strings.ContainsAny(c.name+c.decl, ",\n") {
				t.Errorf("%s: column %q %q", tb.name, c.name, c.decl)
			}
		}
	}
}
