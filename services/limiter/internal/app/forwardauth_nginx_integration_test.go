//go:build integration && linux

package app

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kurz.dev/pkg/testkit/mdblock"
	"kurz.dev/pkg/testkit/servertest"
)

// readmeFile is the limiter's README, whose forward-auth examples the
// tests run.
const readmeFile = "../../README.md"

// readmeBlock is the first fenced block of lang in the limiter's README
// that holds marker, failing the test when there is none.
func readmeBlock(t *testing.T, lang, marker string) string {
	t.Helper()
	for _, b := range mdblock.In(mdblock.Read(t, readmeFile), "", lang) {
		if strings.Contains(b.Code, marker) {
			return b.Code
		}
	}
	t.Fatalf("%s has no ```%s block holding %q", readmeFile, lang, marker)
	return ""
}

// nginxBinary is Debian's nginx (make nginx installs it). Without it the
// test fails under CI and is skipped, saying so, elsewhere.
func nginxBinary(t *testing.T) string {
	t.Helper()
	if bin, err := exec.LookPath("nginx"); err == nil {
		return bin
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx" // not on a user's PATH on Debian
	}
	const msg = "nginx is not installed, so the README's nginx recipe is not run: " +
		"make nginx installs it (Debian's nginx-light; make test does)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// startNginx runs nginx with the server block, its files in a directory
// of the test's own, as the current user, in the foreground of a process
// the test owns; it returns the address it serves on once it accepts
// connections, and stops it when the test ends.
func startNginx(t *testing.T, bin, server string) string {
	t.Helper()
	dir := t.TempDir()
	addr, err := servertest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(server, "listen 8080;") {
		t.Fatal("the nginx recipe no longer listens on 8080: update the test's substitutions")
	}
	server = strings.Replace(server, "listen 8080;", "listen "+addr+";", 1)
	userLine := ""
	if os.Geteuid() == 0 { // workers would otherwise run as nobody
		u, err := user.Current()
		if err != nil {
			t.Fatal(err)
		}
		userLine = "user " + u.Username + ";"
	}
	conf := fmt.Sprintf(`daemon off;
master_process off;
%s
pid %[2]s/nginx.pid;
error_log %[2]s/error.log info;
events { worker_connections 64; }
http {
    access_log %[2]s/access.log;
    client_body_temp_path %[2]s/body;
    proxy_temp_path %[2]s/proxy;
    fastcgi_temp_path %[2]s/fastcgi;
    uwsgi_temp_path %[2]s/uwsgi;
    scgi_temp_path %[2]s/scgi;
%[3]s
}
`, userLine, dir, server)
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	errorLog := filepath.Join(dir, "error.log")
	args := []string{"-p", dir, "-c", confPath, "-e", errorLog}
	if out, err := exec.Command(bin, append([]string{"-t"}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("nginx -t refuses the README's recipe: %v\n%s\n%s", err, out, conf)
	}
	cmd := exec.Command(bin, args...)
	// nginx dies with the test binary, whatever kills it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out servertest.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("nginx does not start: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGQUIT) // graceful
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	serving := servertest.Eventually(10*time.Second, func() bool {
		select {
		case <-exited:
			return true
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		return c.Close() == nil
	})
	select {
	case <-exited:
		log, _ := os.ReadFile(errorLog)
		t.Fatalf("nginx exited at start: %s\nerror log:\n%s", out.String(), log)
	default:
	}
	if !serving {
		log, _ := os.ReadFile(errorLog)
		t.Fatalf("nginx does not accept connections on %s after 10 s; error log:\n%s", addr, log)
	}
	return addr
}

// The README's nginx recipe and rules, run with a real nginx between a
// client and a service: every request asks the limiter first (nginx's
// auth_request), and the client gets the limiter's RateLimit fields.
// 5 sign-ins (POST /login) reach the service, the 6th does not: nginx
// answers it 429 with the limiter's Retry-After, the limiter's 403 turned
// round by the recipe. Other requests still pass. With the limiter gone,
// nginx refuses (500), as the README says.
func TestForwardAuthNginxRecipe(t *testing.T) {
	bin := nginxBinary(t)
	rules := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(rules, []byte(readmeBlock(t, "yaml", "  edge:")), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startForwardAuth(t, rules)

	var mu sync.Mutex
	reached := map[string]int{} // "METHOD /path" -> requests the service got
	service := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		reached[req.Method+" "+req.URL.Path]++
		mu.Unlock()
		_, _ = io.WriteString(w, "from the service\n")
	}))
	defer service.Close()

	server := readmeBlock(t, "nginx", "auth_request")
	for from, to := range map[string]string{
		"127.0.0.1:9191": strings.TrimPrefix(r.HTTP, "http://"),
		"127.0.0.1:3000": strings.TrimPrefix(service.URL, "http://"),
	} {
		if !strings.Contains(server, from) {
			t.Fatalf("the nginx recipe no longer names %s: update the test's substitutions", from)
		}
		server = strings.ReplaceAll(server, from, to)
	}
	base := "http://" + startNginx(t, bin, server)

	send := func(method, path string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader("user=alice"))
		if err != nil {
			t.Fatal(err)
		}
		return do(t, req)
	}

	resp, body := send(http.MethodGet, "/account")
	if resp.StatusCode != http.StatusOK || body != "from the service\n" {
		t.Fatalf("GET /account: %d %q, want 200 from the service", resp.StatusCode, body)
	}
	wantFields(t, "GET /account", resp.Header, map[string]string{
		"RateLimit-Policy": `"edge/per-ip";q=600;w=60`, "RateLimit": `"edge/per-ip";r=`,
	})
	for i := range 5 {
		resp, body := send(http.MethodPost, "/login")
		if resp.StatusCode != http.StatusOK || body != "from the service\n" {
			t.Fatalf("sign-in %d: %d %q, want 200 from the service", i+1, resp.StatusCode, body)
		}
		wantFields(t, fmt.Sprintf("sign-in %d", i+1), resp.Header, map[string]string{
			"RateLimit-Policy": `"edge/login";q=5;w=900`, "RateLimit": `"edge/login";r=` + strconv.Itoa(4-i) + ";t=",
		})
	}
	resp, body = send(http.MethodPost, "/login")
	if resp.StatusCode != http.StatusTooManyRequests || body != "rate limit exceeded\n" {
		t.Errorf("sign-in 6: %d %q, want 429, rate limit exceeded", resp.StatusCode, body)
	}
	// 5 every 15 minutes: the next in 3 minutes at most.
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 || s > 180 {
		t.Errorf("sign-in 6: Retry-After %q, want 1 to 180 s", resp.Header.Get("Retry-After"))
	}
	wantFields(t, "sign-in 6", resp.Header, map[string]string{"RateLimit": `"edge/login";r=0;t=`})
	// nginx lets a Host hold '?' and '#' and writes it into X-Original-URL
	// as sent ($http_host): the sign-in is still POST /login, the path
	// nginx routes and proxies, and still refused.
	for _, host := range []string{"shop.example?", "shop.example#"} {
		if code, body := sendRaw(t, strings.TrimPrefix(base, "http://"), "POST /login HTTP/1.1\r\nHost: "+host+
			"\r\nContent-Length: 10\r\nConnection: close\r\n\r\nuser=alice"); code != http.StatusTooManyRequests {
			t.Errorf("sign-in 6 with Host %q: %d %q, want 429", host, code, body)
		}
	}
	// Nor is it another path with a fragment, which nginx routes as
	// /login too, or a Java server's ;parameters.
	for _, target := range []string{"/login#x", "/login;jsessionid=1"} {
		if code, body := sendRaw(t, strings.TrimPrefix(base, "http://"), "POST "+target+" HTTP/1.1\r\nHost: shop.example"+
			"\r\nContent-Length: 10\r\nConnection: close\r\n\r\nuser=alice"); code != http.StatusTooManyRequests {
			t.Errorf("sign-in 6 as POST %s: %d %q, want 429", target, code, body)
		}
	}
	if resp, body := send(http.MethodPost, "/account"); resp.StatusCode != http.StatusOK {
		t.Errorf("POST /account after the sign-ins ran out: %d %q, want 200", resp.StatusCode, body)
	}
	mu.Lock()
	if want := map[string]int{"GET /account": 1, "POST /login": 5, "POST /account": 1}; fmt.Sprint(reached) != fmt.Sprint(want) {
		t.Errorf("the service got %v, want %v", reached, want)
	}
	mu.Unlock()

	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if resp, body := send(http.MethodGet, "/account"); resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("GET /account with the limiter gone: %d %q, want 500", resp.StatusCode, body)
	}
}

// sendRaw sends raw, a request as it goes on the wire (one Go's client
// would refuse to send), to addr and returns the answer's status and body.
func sendRaw(t *testing.T, addr, raw string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", raw, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// The README's curl example of the forward auth, on the shipped rules and
// the real Redis Cluster, answers what the README shows, byte for byte
// but the date (…).
func TestForwardAuthReadmeExample(t *testing.T) {
	example := readmeBlock(t, "sh", "/forward-auth/demo")
	cmd, want, _ := strings.Cut(example, "\n")
	const curl = `$ curl -si '127.0.0.1:9191/forward-auth/demo?from=traefik&d=user=header:X-User' -H 'X-Forwarded-Method: GET' -H 'X-User: alice'`
	if cmd != curl {
		t.Fatalf("the README's example is %q, the test sends %q: update the test", cmd, curl)
	}
	r := startWith(t, map[string]string{
		"KURZ_LIMITER_RULES_SOURCE":     "file", // the shipped rules, built in
		"KURZ_LIMITER_FORWARD_AUTH":     "true",
		"KURZ_LIMITER_REDIS_KEY_PREFIX": fmt.Sprintf("fwdauth-readme-%d:", time.Now().UnixNano()),
	})
	// What curl sends, and what it prints: the answer's head as it came.
	c, err := net.Dial("tcp", strings.TrimPrefix(r.HTTP, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = io.WriteString(c, "GET /forward-auth/demo?from=traefik&d=user=header:X-User HTTP/1.1\r\nHost: 127.0.0.1:9191\r\n"+
		"User-Agent: curl/7.88.1\r\nAccept: */*\r\nX-Forwarded-Method: GET\r\nX-User: alice\r\n\r\n")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the answer's head: %v (so far %q)", err, got)
		}
		if line = strings.TrimRight(line, "\r\n"); line == "" {
			break
		}
		if strings.HasPrefix(line, "Date: ") {
			line = "Date: …"
		}
		got = append(got, line)
	}
	if g, w := strings.Join(got, "\n"), strings.TrimSpace(want); g != w {
		t.Errorf("the answer's head:\n%s\nthe README shows:\n%s", g, w)
	}
}
