package linearizability

import (
	"bytes"
	"fmt"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	gocql "github.com/apache/cassandra-gocql-driver/v2"
)

// clusterNodes is the number of `sluice serve` processes of the cluster tests.
const clusterNodes = 3

// leaderLogFilter keeps the server's log at warn but lets openraft say when this node becomes
// or stops being the metadata group's leader, which is how the test finds the leader to kill.
const leaderLogFilter = "warn,openraft::engine::handler::server_state_handler=info"

// clusterNode is one `sluice serve` of the test cluster on its own loopback IP, 127.0.0.<index>;
// every node binds the same two ports on its IP. It can be killed with SIGKILL and restarted on
// the same data directory.
type clusterNode struct {
	process
	t             *testing.T
	index         int
	bin           string
	dataDir       string
	cqlPort       int
	internodePort int
	extra         []string
	logFrom       int64 // where the running process's output begins in logPath
}

func (n *clusterNode) ip() string { return fmt.Sprintf("127.0.0.%d", n.index) }

// portFreeOnClusterIPs picks a port free on 127.0.0.1 to 127.0.0.3, below 20000: the other Go,
// Rust and Python harnesses take theirs from 20000-32000, and Linux's ephemeral range starts
// at 32768, so neither a test running beside this one nor a client socket takes it meanwhile.
func portFreeOnClusterIPs() int {
	for try := 0; try < 1000; try++ {
		port := 10000 + rand.Intn(9000)
		free := true
		for i := 1; i <= clusterNodes && free; i++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:%d", i, port))
			if err != nil {
				free = false
				continue
			}
			l.Close()
		}
		if free {
			return port
		}
	}
	panic("no port free on 127.0.0.1-3 in 10000..19000")
}

func (n *clusterNode) start() error {
	log, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	info, err := log.Stat()
	if err != nil {
		log.Close()
		return err
	}
	args := []string{
		"serve",
		"--listen", fmt.Sprintf("%s:%d", n.ip(), n.cqlPort),
		"--internode-listen", fmt.Sprintf("%s:%d", n.ip(), n.internodePort),
		"--metrics-listen", "off",
		"--shard-aware-port", "off",
		"--data-dir", n.dataDir,
		"--shards", "2",
		"--num-tokens", "8",
		"--durability", "batch",
		"--log", leaderLogFilter,
	}
	if n.index > 1 {
		args = append(args, "--seeds", fmt.Sprintf("127.0.0.1:%d", n.internodePort))
	}
	cmd := exec.Command(n.bin, append(args, n.extra...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); log.Close(); close(exited) }()
	n.cmd, n.exited, n.logFrom = cmd, exited, info.Size()
	// A node opens its CQL port once it has joined and caught up with the group's log.
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("node %d exited early", n.index)
		default:
		}
		c, err := net.DialTimeout("tcp", fmt.Sprintf("%s:%d", n.ip(), n.cqlPort), 500*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	n.kill()
	return fmt.Errorf("node %d did not listen within 90 s", n.index)
}

// leadsSince says whether the running process's last word on leadership was "become leader",
// and when it said so (the log line's timestamp, which sorts as text).
func (n *clusterNode) leadsSince() (bool, string) {
	b, err := os.ReadFile(n.logPath)
	if err != nil || int64(len(b)) < n.logFrom {
		return false, ""
	}
	b = b[n.logFrom:]
	become := bytes.LastIndex(b, []byte("become leader"))
	if become < 0 || become < bytes.LastIndex(b, []byte("quit leader")) {
		return false, ""
	}
	prefix := strings.Fields(string(b[bytes.LastIndexByte(b[:become], '\n')+1 : become]))
	if len(prefix) == 0 {
		return true, ""
	}
	return true, prefix[0]
}

var (
	// ansiEscape matches the colour codes of the server's log lines.
	ansiEscape = regexp.MustCompile("\x1b\\[[0-9;]*m")
	// digits are left out when warnings are counted, so that request ids and terms add up.
	digits = regexp.MustCompile("[0-9]+")
)

// warnings counts the node's log lines at WARN or ERROR by their text after the timestamp,
// with numbers left out, across all its processes.
func (n *clusterNode) warnings() map[string]int {
	b, _ := os.ReadFile(n.logPath)
	counts := map[string]int{}
	for _, line := range strings.Split(ansiEscape.ReplaceAllString(string(b), ""), "\n") {
		fields := strings.Fields(line)
		if len(fields) >= 3 && (fields[1] == "WARN" || fields[1] == "ERROR") {
			text := digits.ReplaceAllString(strings.Join(fields[1:], " "), "N")
			if len(text) > 160 {
				text = text[:160]
			}
			counts[text]++
		}
	}
	return counts
}

func (n *clusterNode) dial(deadline time.Time) (*gocql.Session, error) {
	return connectUntil(n.ip(), n.cqlPort, deadline)
}

// testCluster is three `sluice serve` processes that form one cluster; nodes 2 and 3 join
// through node 1. They are stopped and their data removed when the test ends.
type testCluster struct {
	t     *testing.T
	nodes []*clusterNode
}

func startCluster(t *testing.T) *testCluster {
	extra := strings.Fields(os.Getenv("LINZ_SERVER_FLAGS"))
	dir := t.TempDir()
	c := &testCluster{t: t}
	bin := sluiceBin(t)
	var err error
	for try := 0; try < 3; try++ {
		c.nodes = nil
		cql, internode := portFreeOnClusterIPs(), portFreeOnClusterIPs()
		for i := 1; i <= clusterNodes; i++ {
			n := &clusterNode{
				t: t, index: i, bin: bin, extra: extra, cqlPort: cql, internodePort: internode,
				dataDir: filepath.Join(dir, fmt.Sprintf("try%d-node%d", try, i)),
				process: process{logPath: filepath.Join(dir, fmt.Sprintf("try%d-node%d.log", try, i))},
			}
			if err = n.start(); err != nil {
				break
			}
			c.nodes = append(c.nodes, n)
		}
		if err == nil {
			break
		}
		// A port taken between the check and the bind: start again on other ports.
		tail := ""
		if len(c.nodes) < clusterNodes {
			tail = (&process{logPath: filepath.Join(dir, fmt.Sprintf("try%d-node%d.log", try, len(c.nodes)+1))}).logTail()
		}
		c.stop()
		t.Logf("cluster start failed (%v), trying other ports:\n%s", err, tail)
	}
	if err != nil {
		t.Fatalf("the cluster did not start: %v", err)
	}
	t.Cleanup(c.stop)
	return c
}

func (c *testCluster) stop() {
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Go(n.stop)
	}
	wg.Wait()
}

// leader is the live node that says it leads the metadata group (the one that said so last
// if several do), or nil.
func (c *testCluster) leader() *clusterNode {
	var best *clusterNode
	var bestSince string
	for _, n := range c.nodes {
		if !n.alive() {
			continue
		}
		if leads, since := n.leadsSince(); leads && (best == nil || since > bestSince) {
			best, bestSince = n, since
		}
	}
	return best
}

// createClusterTable creates keyspace linz with replication factor 3 through node 1 and waits
// until every node answers a SERIAL read of the new table.
func createClusterTable(t *testing.T, c *testCluster) {
	first := c.nodes[0]
	cfg := gocql.NewCluster(first.ip())
	cfg.Port = first.cqlPort
	cfg.ProtoVersion = 4
	cfg.DisableInitialHostLookup = true
	cfg.HostFilter = gocql.WhiteListHostFilter(first.ip())
	cfg.Timeout = 20 * time.Second
	sess, err := cfg.CreateSession()
	if err != nil {
		t.Fatalf("connect to node 1: %v", err)
	}
	defer sess.Close()
	for _, stmt := range []string{
		"CREATE KEYSPACE linz WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}",
		"CREATE TABLE linz.t (k int PRIMARY KEY, v int)",
	} {
		if err := sess.Query(stmt).Exec(); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range c.nodes {
		for {
			s, err := n.dial(deadline)
			if err == nil {
				_, err = execute(s, Input{Kind: OpRead, Key: 0})
				s.Close()
			}
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d does not serve linz.t within 30 s: %v", n.index, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// clusterWorkload describes one recorded cluster run: clients pinned to the nodes in turn, and
// a node killed with SIGKILL every killEvery from firstKill on (the group's leader first, then
// a follower, in turn), restarted on the same data directory downFor later (a leader once
// another node leads, within maxElectionWait).
type clusterWorkload struct {
	clients   int
	keys      int
	duration  time.Duration
	firstKill time.Duration
	killEvery time.Duration
	downFor   time.Duration
}

// defaultClusterWorkload is the suite's run; LINZ_CLUSTER_SECONDS makes it longer, with a kill
// every 11 s all along.
func defaultClusterWorkload(t *testing.T) clusterWorkload {
	w := clusterWorkload{clients: 6, keys: 6, duration: 30 * time.Second, firstKill: 8 * time.Second,
		killEvery: 11 * time.Second, downFor: 1500 * time.Millisecond}
	if s := os.Getenv("LINZ_CLUSTER_SECONDS"); s != "" {
		seconds, err := strconv.Atoi(s)
		if err != nil || seconds < 20 {
			t.Fatalf("LINZ_CLUSTER_SECONDS=%q: want a whole number of seconds, at least 20", s)
		}
		w.duration = time.Duration(seconds) * time.Second
	}
	return w
}

// maxElectionWait bounds how long a killed leader stays down waiting for a new leader.
const maxElectionWait = 10 * time.Second

// killEvent is one kill -9 and restart, on the history's clock.
type killEvent struct {
	node         int
	leaderWanted bool // this kill was meant for the group's leader
	leaderKnown  bool // some node said it led when the victim was picked
	wasLeader    bool
	killedAt     int64
	newLeader    int // the node that said it led once the victim was down (0: none)
	restartedAt  int64
	restartTook  time.Duration
}

// clusterResult is a recorded cluster run.
type clusterResult struct {
	runResult
	kills      []killEvent
	runEnd     int64 // when the clients stopped, on the history's clock
	finalReads int
}

// recordCluster runs w on c and returns the history, which ends with SERIAL reads of every key
// through every node.
func recordCluster(t *testing.T, c *testCluster, w clusterWorkload) clusterResult {
	rec := &recorder{start: time.Now(), errs: map[string]int{}}
	end := rec.start.Add(w.duration)
	var values atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < w.clients; i++ {
		n := c.nodes[i%clusterNodes]
		wg.Go(func() {
			runClient(n.dial, n.index, workload{keys: w.keys}, rec, int64(i)+time.Now().UnixNano(), &values, end)
		})
	}
	var res clusterResult
	for k := 0; ; k++ {
		at := w.firstKill + time.Duration(k)*w.killEvery
		// Leave time after the restart for the restarted node to serve again.
		if at+w.downFor+5*time.Second > w.duration {
			break
		}
		time.Sleep(time.Until(rec.start.Add(at)))
		leader := c.leader()
		ev := killEvent{leaderWanted: k%2 == 0, leaderKnown: leader != nil}
		victim := leader
		if !ev.leaderWanted || leader == nil {
			// A node that does not say it leads: a follower, or any node when none does.
			var others []*clusterNode
			for _, n := range c.nodes {
				if n != leader {
					others = append(others, n)
				}
			}
			victim = others[rand.Intn(len(others))]
		}
		ev.node, ev.wasLeader = victim.index, leader != nil && victim == leader
		ev.killedAt = rec.now()
		victim.kill()
		time.Sleep(w.downFor)
		// The leader stays down until another node takes over (bounded), so that the group
		// fails over rather than waiting for it to come back.
		for wait := time.Now().Add(maxElectionWait); ev.wasLeader && c.leader() == nil && time.Now().Before(wait); {
			time.Sleep(50 * time.Millisecond)
		}
		if leader := c.leader(); leader != nil {
			ev.newLeader = leader.index
		}
		ev.restartedAt = rec.now()
		began := time.Now()
		if err := victim.start(); err != nil {
			t.Fatalf("node %d did not restart: %v\n%s", victim.index, err, victim.logTail())
		}
		ev.restartTook = time.Since(began)
		t.Logf("kill -9 of node %d (leader: %v) at %v; leader while it was down: node %d (0: none seen); restarted at %v, serving %v later",
			ev.node, ev.wasLeader, time.Duration(ev.killedAt).Round(time.Millisecond), ev.newLeader,
			time.Duration(ev.restartedAt).Round(time.Millisecond), ev.restartTook.Round(time.Millisecond))
		res.kills = append(res.kills, ev)
	}
	wg.Wait()
	res.runEnd = rec.now()
	for _, n := range c.nodes {
		if !n.alive() {
			t.Fatalf("node %d died during the run:\n%s", n.index, n.logTail())
		}
	}
	// Every node reads every key at SERIAL; a read that fails (a node still catching up) is
	// tried again, and only answered reads join the history.
	clientID := rec.newClientID()
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range c.nodes {
		sess, err := n.dial(deadline)
		if err != nil {
			t.Fatalf("final connect to node %d: %v", n.index, err)
		}
		for key := 0; key < w.keys; key++ {
			for {
				in := Input{Kind: OpRead, Key: key, Node: n.index}
				call := rec.now()
				out, err := execute(sess, in)
				if err == nil {
					rec.add(porcupine.Operation{ClientId: clientID, Input: in, Call: call, Output: out, Return: rec.now()})
					res.finalReads++
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("final serial read of k%d through node %d: %v", key, n.index, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		sess.Close()
	}
	res.runResult = runResult{history: rec.history(), unknown: len(rec.unknown), notSent: rec.notSent.Load(), errs: rec.errs}
	return res
}

// Three nodes, keyspace replication factor 3, six clients pinned two to each node doing inserts
// if not exists, compare-and-sets and SERIAL reads on six keys (each LWT goes through the
// cluster's Raft transaction log), while the group's leader and then a follower are killed with
// SIGKILL and restarted on their data directories. Every operation that ended in an error
// (timeout, unavailable, lost connection) stays in the history as an unknown outcome; porcupine
// must find the whole history linearizable. The same history, doctored with one SERIAL read of a
// value never written, must be rejected, so the check shown passing could have failed.
func TestLWTOnThreeNodesIsLinearizableAcrossKill9(t *testing.T) {
	began := time.Now()
	c := startCluster(t)
	createClusterTable(t, c)
	t.Logf("three nodes up and linz.t created (RF 3) in %v", time.Since(began).Round(time.Millisecond))
	w := defaultClusterWorkload(t)
	res := recordCluster(t, c, w)
	summarize(t, res.runResult)
	t.Logf("%d final SERIAL reads through the three nodes; %d kills", res.finalReads, len(res.kills))
	if len(res.history) < 100 {
		t.Fatalf("only %d operations recorded: the run checked too little", len(res.history))
	}
	leaderKills := 0
	for _, ev := range res.kills {
		if ev.leaderWanted && !ev.leaderKnown {
			t.Logf("no node said it led the group at %v: a random node was killed instead",
				time.Duration(ev.killedAt).Round(time.Millisecond))
		}
		if ev.wasLeader {
			leaderKills++
		}
	}
	if len(res.kills) > 0 && leaderKills == 0 {
		// The leader is read from openraft's "become leader" lines (leaderLogFilter).
		t.Errorf("no kill found the group's leader in the nodes' logs: the leader kill did not happen")
	}
	// The clients' operations completed after the last restart, by the node that served them.
	var completedAfter [clusterNodes + 1]int
	if len(res.kills) > 0 {
		for _, op := range res.history {
			in := op.Input.(Input)
			if op.Call > res.kills[len(res.kills)-1].restartedAt && op.Return < res.runEnd && !op.Output.(Output).Unknown {
				completedAfter[in.Node]++
			}
		}
		t.Logf("operations completed after the last restart through nodes 1, 2, 3: %v", completedAfter[1:])
	}
	for _, n := range c.nodes {
		counts := n.warnings()
		var texts []string
		for text := range counts {
			texts = append(texts, text)
		}
		sort.Slice(texts, func(i, j int) bool { return counts[texts[i]] > counts[texts[j]] })
		var lines []string
		for _, text := range texts[:min(len(texts), 6)] {
			lines = append(lines, fmt.Sprintf("%dx %s", counts[text], text))
		}
		t.Logf("node %d: %d kinds of warnings/errors logged, the most frequent:\n  %s", n.index, len(texts), strings.Join(lines, "\n  "))
	}
	result, path, info := check(t, res.history)
	if result != porcupine.Ok {
		for _, line := range explainViolation(res.history, info) {
			t.Log(line)
		}
		t.Fatalf("history is not linearizable (porcupine: %s); visualization: %s", result, path)
	}
	if len(res.kills) > 0 && completedAfter[1]+completedAfter[2]+completedAfter[3] == 0 {
		t.Fatalf("no operation completed after the last restart: the cluster did not recover")
	}
	requireDoctoredHistoryRejected(t, res)
	t.Logf("whole test: %v", time.Since(began).Round(time.Millisecond))
}

// neverWritten is a value no run writes (they write positive values; absent is -1).
const neverWritten = -2

// requireDoctoredHistoryRejected changes one SERIAL read in the recorded history, the first
// that began after the first restart and found a row, to return a value never written, and
// fails unless porcupine rejects the result.
func requireDoctoredHistoryRejected(t *testing.T, res clusterResult) {
	after := int64(0)
	if len(res.kills) > 0 {
		after = res.kills[0].restartedAt
	}
	doctored := append([]porcupine.Operation(nil), res.history...)
	pick := -1
	for i, op := range doctored {
		out := op.Output.(Output)
		if op.Input.(Input).Kind == OpRead && out.Exists && op.Call > after && (pick < 0 || op.Call < doctored[pick].Call) {
			pick = i
		}
	}
	if pick < 0 {
		t.Fatalf("no SERIAL read found a row after the first restart: nothing to doctor")
	}
	orig := doctored[pick]
	doctored[pick].Output = Output{Exists: true, Value: neverWritten}
	result, _ := porcupine.CheckOperationsVerbose(RegisterModel, doctored, 60*time.Second)
	t.Logf("doctored history (%s changed to read %d): porcupine %s",
		describeOperation(orig.Input, orig.Output), neverWritten, result)
	if result != porcupine.Illegal {
		t.Fatalf("porcupine did not reject a history with a read of a value never written: %s", result)
	}
}
