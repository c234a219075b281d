//go:build integration

package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kurz.dev/pkg/linkpass"
	"kurz.dev/pkg/testkit/servertest"
	"kurz.dev/services/gateway/gatewaytest"
)

// The memory tests run the gateway and the shortener as the pods of
// deploy/k8s/base run them: the same GOMEMLIMIT, and a peak resident set
// that must stay below the container's memory limit. Their binaries are
// built without the race detector, whose shadow memory would swamp what the
// tests measure.
const (
	podMemoryLimit = 256 << 20 // limits.memory of the gateway and shortener pods
	podGoMemLimit  = "200MiB"  // their GOMEMLIMIT
)

// memoryBinaries builds the gateway and the shortener without the race
// detector, once per test binary, into the stack's directory (removed with
// the stack).
var memoryBinaries = sync.OnceValues(func() (string, error) {
	dir := filepath.Join(stack.BinDir, "without-race")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	return dir, servertest.BuildServicesWithoutRace(dir, "gateway", "shortener")
})

// memoryProcess starts binary name of memoryBinaries as a pod would run it
// (GOMEMLIMIT), with env given its gRPC and HTTP addresses; it returns the
// process and its HTTP address.
func memoryProcess(t *testing.T, name, service string, env func(g, h string) []string) (*servertest.Process, string) {
	t.Helper()
	dir, err := memoryBinaries()
	if err != nil {
		t.Fatal(err)
	}
	httpAddr, err := servertest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	p := servertest.Run(t, dir, servertest.Spec{Name: name, Service: service, HTTPAddr: httpAddr, Env: func(g, h string) []string {
		return append(env(g, h), "GOMEMLIMIT="+podGoMemLimit, "KURZ_LOG_LEVEL=warn")
	}})
	return p, httpAddr
}

// memoryGateway starts a gateway process in front of the stack's limiter
// and analytics and the given shortener; it returns the process and its
// HTTP base URL.
func memoryGateway(t *testing.T, shortener string, overrides map[string]string) (*servertest.Process, *servertest.Running) {
	t.Helper()
	p, httpAddr := memoryProcess(t, "gateway", "", func(g, h string) []string {
		env := gatewaytest.GatewayEnv(stack.Limiter.GRPCAddr, shortener, stack.Analytics.GRPCAddr, adminToken)
		env["KURZ_GATEWAY_GRPC_ADDR"], env["KURZ_GATEWAY_HTTP_ADDR"] = g, h
		env["KURZ_GATEWAY_TRUSTED_PROXIES"] = "127.0.0.1/32, ::1"
		maps.Copy(env, overrides)
		var out []string
		for k, v := range env {
			out = append(out, k+"="+v)
		}
		return out
	})
	return p, &servertest.Running{HTTP: "http://" + httpAddr}
}

// watchPeak polls p's peak resident set until stop is closed, and kills p
// as soon as it passes limit, so that a regression does not take the
// machine's memory with it. It returns the highest peak it saw.
func watchPeak(t *testing.T, p *servertest.Process, limit int64, stop <-chan struct{}) <-chan int64 {
	out := make(chan int64, 1)
	go func() {
		var seen int64
		defer func() { out <- seen }()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, peak, err := p.Memory(); err == nil {
				seen = max(seen, peak)
			}
			if seen >= limit {
				t.Logf("%s passed %d MiB of resident memory: killed", p.Name, limit>>20)
				p.Kill()
				return
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

// answer is one response of a concurrent request, read whole; err is set
// when no response came.
type answer struct {
	code   int
	header http.Header
	body   []byte
	err    error
}

func (a answer) String() string {
	if a.err != nil {
		return "no answer: " + a.err.Error()
	}
	return fmt.Sprintf("%d %s", a.code, bytes.TrimSpace(a.body))
}

// sendAll sends the requests all at once and returns their answers in order.
func sendAll(reqs []*http.Request) []answer {
	out := make([]answer, len(reqs))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, req := range reqs {
		wg.Go(func() {
			<-start
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				out[i].err = err
				return
			}
			defer resp.Body.Close()
			out[i].code, out[i].header = resp.StatusCode, resp.Header
			out[i].body, out[i].err = io.ReadAll(resp.Body)
		})
	}
	close(start)
	wg.Wait()
	return out
}

// tally counts answers by status and error code, for the test log.
func tally(answers []answer) string {
	counts := map[string]int{}
	for _, a := range answers {
		var body struct{ Code string }
		_ = json.Unmarshal(a.body, &body)
		counts[fmt.Sprintf("%d %s", a.code, body.Code)]++
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		out = append(out, fmt.Sprintf("%s: %d", strings.TrimSpace(k), counts[k]))
	}
	return strings.Join(out, ", ")
}

// refusalProblem says what is wrong with a refusal for capacity or quota:
// it must be a 429 or 503 with a Retry-After of at least a second and the
// problem detail with that code; "" when it is one.
func refusalProblem(a answer) string {
	if a.err != nil || (a.code != http.StatusTooManyRequests && a.code != http.StatusServiceUnavailable) {
		return "want 200, 429 or 503: " + a.String()
	}
	if s, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || s < 1 {
		return "no Retry-After of whole seconds: " + a.String()
	}
	var body struct{ Code, Detail string }
	want := map[int][]string{http.StatusTooManyRequests: {"RESOURCE_EXHAUSTED"}, http.StatusServiceUnavailable: {"UNAVAILABLE", "DEADLINE_EXCEEDED"}}[a.code]
	if json.Unmarshal(a.body, &body) != nil || !slices.Contains(want, body.Code) || body.Detail == "" {
		return fmt.Sprintf("not a problem detail with code %v: %s", want, a)
	}
	return ""
}

// TestConcurrentPasswordChangesStayWithinShortenerMemory (issue #16,
// finding 1): 200 concurrent PATCHes that each set a password (Argon2id,
// 19 MiB) and change the link's URL and tags, through a gateway process, to
// a shortener process configured as its pod is. The shortener's peak
// resident set stays below the pod's memory limit; every call is answered,
// 200 or a 429/503 with Retry-After; and every link ends either fully
// changed (new URL, tags and a hash of the new password) or not at all
// (old URL, tags and hash), the changed ones being exactly those answered
// 200.
func TestConcurrentPasswordChangesStayWithinShortenerMemory(t *testing.T) {
	const n = 200
	sh, _ := memoryProcess(t, "shortener", shortenerService, func(g, h string) []string {
		return []string{"KURZ_SHORTENER_GRPC_ADDR=" + g, "KURZ_SHORTENER_HTTP_ADDR=" + h,
			"KURZ_LIMITER_GRPC_ADDR=" + stack.Limiter.GRPCAddr, "KURZ_SHORTENER_LIMITER_TIMEOUT=1s",
			"KURZ_SHORTENER_BASE_URL=" + shortBase}
	})
	_, gw := memoryGateway(t, sh.GRPCAddr, nil)
	tn := newTenant(t, gw, "free")
	c := newClient(t, gw, tn.key)

	// The links, as they are before (without a password: 200 hashes would
	// take longer than a batch call may on a loaded machine).
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf(`{"longUrl":"https://example.com/old/%d","tags":["old"]}`, i)
	}
	r := c.do("POST", "/v1/links:batch", `{"requests":[`+strings.Join(items, ",")+`]}`)
	var made struct {
		Results []struct {
			Link struct{ Code string } `json:"link"`
		} `json:"results"`
		Created int `json:"created"`
	}
	if r.code != http.StatusOK || json.Unmarshal(r.body, &made) != nil || made.Created != n {
		t.Fatalf("create %d links: %s", n, r)
	}
	codes := make([]string, n)
	for i, res := range made.Results {
		codes[i] = res.Link.Code
	}
	before := linkRows(t, codes)

	reqs := make([]*http.Request, n)
	for i, code := range codes {
		body := fmt.Sprintf(`{"longUrl":"https://example.com/new/%d","tags":["new"],"password":"new passphrase %d"}`, i, i)
		req, err := http.NewRequest("PATCH", gw.HTTP+"/v1/links/"+code, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tn.key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Forwarded-For", c.ip)
		reqs[i] = req
	}
	stop := make(chan struct{})
	peakSeen := watchPeak(t, sh, podMemoryLimit, stop)
	answers := sendAll(reqs)
	close(stop)
	peak := <-peakSeen
	if _, p, err := sh.Memory(); err == nil {
		peak = max(peak, p)
	}
	if peak >= podMemoryLimit {
		t.Fatalf("the shortener's peak resident set reached %d MiB (stopped there if over), want below its pod's limit of %d MiB", peak>>20, podMemoryLimit>>20)
	}

	after := linkRows(t, codes)
	changed, refused := 0, 0
	for i, a := range answers {
		old, now := before[codes[i]], after[codes[i]]
		isOld := now.url == old.url && slices.Equal(now.tags, old.tags) && now.hash == old.hash
		isNew := now.url == fmt.Sprintf("https://example.com/new/%d", i) && slices.Equal(now.tags, []string{"new"}) &&
			now.hash != "" && now.hash != old.hash
		switch {
		case a.err == nil && a.code == http.StatusOK:
			changed++
			if !isNew {
				t.Errorf("link %d answered 200 but is not fully changed: %+v", i, now)
			}
			// Argon2id is slow in this (race) binary: the hash of a few
			// changed links is checked against its new password.
			if changed <= 3 {
				if ok, err := linkpass.Verify(now.hash, fmt.Sprintf("new passphrase %d", i)); !ok || err != nil {
					t.Errorf("link %d: the stored hash does not verify its new password (%v)", i, err)
				}
			}
		case refusalProblem(a) != "":
			t.Errorf("PATCH %d: %s", i, refusalProblem(a))
		case strings.Contains(string(a.body), `"DEADLINE_EXCEEDED"`):
			// The gateway gave up waiting: the change may or may not
			// have been committed, but never in part.
			if !isOld && !isNew {
				t.Errorf("link %d is half-changed after a timeout (%s): %+v, was %+v", i, a, now, old)
			}
		default:
			refused++
			if !isOld {
				t.Errorf("link %d was refused (%s) but is not fully as before: %+v, was %+v", i, a, now, old)
			}
		}
	}
	t.Logf("%d changed, %d refused (%s); shortener peak resident set %d MiB", changed, refused, tally(answers), peak>>20)
}

// linkRow is what a PATCH of the memory test changes, as stored.
type linkRow struct {
	url  string
	tags []string
	hash string
}

// linkRows reads the stored state of the links.
func linkRows(t *testing.T, codes []string) map[string]linkRow {
	t.Helper()
	rows, err := stack.DB.Query(context.Background(),
		`SELECT code, long_url, tags, coalesce(password_hash, '') FROM links WHERE code = ANY($1)`, codes)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := make(map[string]linkRow, len(codes))
	for rows.Next() {
		var code string
		var r linkRow
		if err := rows.Scan(&code, &r.url, &r.tags, &r.hash); err != nil {
			t.Fatal(err)
		}
		out[code] = r
	}
	if err := rows.Err(); err != nil || len(out) != len(codes) {
		t.Fatalf("read %d of %d links: %v", len(out), len(codes), err)
	}
	return out
}

// TestConcurrentMaximumImportsStayWithinGatewayMemory (issue #16, finding
// 7): 20 concurrent imports of the largest CSV the gateway takes (20 MB,
// 10,000 rows) to a gateway process configured as its pod is. Its peak
// resident set stays below the pod's memory limit, and every import is
// answered: 200 with one result per row, or a 429/503 with Retry-After.
// The rows' URLs are refused by the shortener (a private host), so the
// imports cost the gateway everything and the database nothing.
func TestConcurrentMaximumImportsStayWithinGatewayMemory(t *testing.T) {
	const imports, rows = 20, 10_000
	gw, api := memoryGateway(t, stack.Shortener.GRPCAddr, nil)
	tn := newTenant(t, api, "free")
	ip := gatewaytest.NewIP()

	const maxBody = rows * 2 << 10 // the gateway's import limit
	var csv bytes.Buffer
	csv.WriteString("long_url,link\n")
	for i := range rows {
		line := fmt.Sprintf(",bit.ly/m%d\n", i)
		pad := (maxBody-csv.Len())/(rows-i) - len(line) - len("http://10.0.0.1/")
		csv.WriteString("http://10.0.0.1/" + strings.Repeat("a", pad) + line)
	}
	body := csv.Bytes()
	if len(body) > maxBody || len(body) < maxBody-rows {
		t.Fatalf("the CSV has %d bytes, want just under %d", len(body), maxBody)
	}

	reqs := make([]*http.Request, imports)
	for i := range reqs {
		req, err := http.NewRequest("POST", api.HTTP+"/v1/links:import", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tn.key)
		req.Header.Set("Content-Type", "text/csv")
		req.Header.Set("X-Forwarded-For", ip)
		reqs[i] = req
	}
	stop := make(chan struct{})
	peakSeen := watchPeak(t, gw, podMemoryLimit, stop)
	answers := sendAll(reqs)
	close(stop)
	peak := <-peakSeen
	if _, p, err := gw.Memory(); err == nil {
		peak = max(peak, p)
	}
	if peak >= podMemoryLimit {
		t.Fatalf("the gateway's peak resident set reached %d MiB (stopped there if over), want below its pod's limit of %d MiB", peak>>20, podMemoryLimit>>20)
	}

	done, refused := 0, 0
	for i, a := range answers {
		if a.err == nil && a.code == http.StatusOK {
			var got importAnswer
			if err := json.Unmarshal(a.body, &got); err != nil || got.Rows != rows || len(got.Results) != rows || got.Failed != rows {
				t.Errorf("import %d: 200 but not one failed result per row: %d rows, %d results, %d failed (%v)",
					i, got.Rows, len(got.Results), got.Failed, err)
			}
			done++
			continue
		}
		if p := refusalProblem(a); p != "" {
			t.Errorf("import %d: %s", i, p)
			continue
		}
		refused++
	}
	t.Logf("%d imports done, %d refused (%s); gateway peak resident set %d MiB", done, refused, tally(answers), peak>>20)
}
