package linearizability

import (
	"fmt"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// server is one `sluice serve` process on loopback ports, with its own data directory; it can
// be killed with SIGKILL and restarted on the same directory and ports.
type server struct {
	process
	t       *testing.T
	bin     string
	dataDir string
	extra   []string
	ports   [4]int // CQL, shard-aware, metrics, internode
}

// process is a running `sluice serve` and its log: what a one-node server and a cluster's node
// share.
type process struct {
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// kill ends the process with SIGKILL: nothing is flushed or closed cleanly.
func (p *process) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// alive says whether the process is still running (it must not die by itself during a test).
func (p *process) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop ends the process with SIGTERM, and with SIGKILL if it has not exited 20 s later.
func (p *process) stop() {
	if p.cmd != nil && p.alive() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			p.kill()
		}
	}
}

// logTail is the end of the process's log, for a failure's message.
func (p *process) logTail() string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// sluiceBin is the binary under test: SLUICE_BIN as the Python tests read it, else the
// workspace's debug or release build.
func sluiceBin(t *testing.T) string {
	if bin := os.Getenv("SLUICE_BIN"); bin != "" {
		return bin
	}
	for _, profile := range []string{"debug", "release"} {
		p, _ := filepath.Abs(filepath.Join("..", "..", "target", profile, "sluice"))
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatal("build sluice first (cargo build -p sluice) or set SLUICE_BIN")
	return ""
}

// freePort picks a port below Linux's ephemeral range, so that client sockets opened meanwhile
// cannot take it before the server binds it.
func freePort() int {
	for i := 0; i < 1000; i++ {
		port := 20000 + rand.Intn(12000)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		l.Close()
		return port
	}
	panic("no free port in 20000..32000")
}

// startServer starts sluice with `--durability batch` (acknowledged writes are fsynced) and
// stops it and removes its data when the test ends. LINZ_SERVER_FLAGS adds flags to every
// server, to run the same checks against other settings.
func startServer(t *testing.T, extra ...string) *server {
	extra = append(extra, strings.Fields(os.Getenv("LINZ_SERVER_FLAGS"))...)
	s := &server{t: t, bin: sluiceBin(t), dataDir: t.TempDir(), extra: extra}
	s.logPath = filepath.Join(s.dataDir, "server.log")
	var err error
	for try := 0; try < 5; try++ {
		for i := range s.ports {
			s.ports[i] = freePort()
		}
		if err = s.start(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("sluice did not start: %v\n%s", err, s.logTail())
	}
	t.Cleanup(s.stop)
	return s
}

func (s *server) addr() string { return fmt.Sprintf("127.0.0.1:%d", s.ports[0]) }

func (s *server) start() error {
	log, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := append([]string{
		"serve",
		"--listen", s.addr(),
		"--data-dir", filepath.Join(s.dataDir, "data"),
		"--shards", "2",
		"--shard-aware-port", strconv.Itoa(s.ports[1]),
		"--metrics-listen", fmt.Sprintf("127.0.0.1:%d", s.ports[2]),
		"--internode-listen", fmt.Sprintf("127.0.0.1:%d", s.ports[3]),
		"--durability", "batch",
		"--log", "warn",
	}, s.extra...)
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); log.Close(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("sluice exited early")
		default:
		}
		up := true
		for _, port := range s.ports[:3] {
			c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 500*time.Millisecond)
			if err != nil {
				up = false
				break
			}
			c.Close()
		}
		if up {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.kill()
	return fmt.Errorf("sluice did not listen within 30 s")
}

// restart starts the server again on the same data directory and ports.
func (s *server) restart() {
	var err error
	for try := 0; try < 20; try++ {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("sluice did not restart: %v\n%s", err, s.logTail())
}
