package linearizability

import (
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	gocql "github.com/apache/cassandra-gocql-driver/v2"
)

// workload describes one recorded run.
type workload struct {
	clients  int           // concurrent LWT clients, each with its own session
	keys     int           // keys of the checked registers
	duration time.Duration // how long clients issue operations
	// killAt, if set, kills the server with SIGKILL that far into the run and restarts it on
	// the same data directory.
	killAt time.Duration
	// plainWritersOtherKeys load the commit path with plain writes to keys outside the history.
	plainWritersOtherKeys int
	// plainWritesSameKeys makes clients also issue plain writes to the checked keys.
	plainWritesSameKeys bool
	tableOptions        string // e.g. "WITH transactional_mode = 'full'"
}

// recorder collects completed operations with times from one monotonic clock.
type recorder struct {
	start        time.Time
	mu           sync.Mutex
	ops          []porcupine.Operation
	unknown      []int // indices of operations whose outcome is unknown
	nextClientID atomic.Int64
	errs         map[string]int
	notSent      atomic.Int64 // operations the driver never sent (no connection to the node)
}

// pendingReturn marks an unknown outcome until the history is complete; see history.
const pendingReturn = -1

func (r *recorder) now() int64 { return int64(time.Since(r.start)) }

func (r *recorder) newClientID() int { return int(r.nextClientID.Add(1) - 1) }

func (r *recorder) add(op porcupine.Operation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if op.Output.(Output).Unknown {
		r.unknown = append(r.unknown, len(r.ops))
		op.Return = pendingReturn
	}
	r.ops = append(r.ops, op)
}

func (r *recorder) noteError(err error) {
	msg := err.Error()
	// Socket errors name the client's ephemeral port; keep their cause only, so they add up.
	if i := strings.LastIndex(msg, ": "); i >= 0 && strings.Contains(msg, " tcp ") {
		msg = msg[i+2:]
	}
	if len(msg) > 80 {
		msg = msg[:80]
	}
	r.mu.Lock()
	r.errs[msg]++
	r.mu.Unlock()
}

// history returns the operations with every unknown outcome's return placed after the last
// event of the history: porcupine's encoding of an operation that may or may not have taken
// effect (as its own tests do with Jepsen's timed-out operations), since it may then be
// linearized anywhere after its call, including after everything else.
func (r *recorder) history() []porcupine.Operation {
	r.mu.Lock()
	defer r.mu.Unlock()
	var last int64
	for _, op := range r.ops {
		last = max(last, op.Call, op.Return)
	}
	for _, i := range r.unknown {
		r.ops[i].Return = last + 1
	}
	return append([]porcupine.Operation(nil), r.ops...)
}

// runResult summarizes a run for the test log and the record.
type runResult struct {
	history     []porcupine.Operation
	unknown     int
	plainWrites int64
	notSent     int64 // operations left out because the driver never sent them
	errs        map[string]int
	killedAt    int64 // when the server was killed, on the history's clock; 0 if it was not
}

// withoutObservationsBeforeKill drops the operations that only observed state (SERIAL reads,
// and conditional writes that did not apply) and began before the kill. Every write and every
// operation after the restart stays, so the check still requires that acknowledged writes
// survive and that the state after the restart is explained by them; it no longer requires
// that what was observed before the kill survives (what TestLWTHistoryIsLinearizableAcrossKillAndRestart checks on a failure).
func withoutObservationsBeforeKill(res runResult) ([]porcupine.Operation, int) {
	var kept []porcupine.Operation
	dropped := 0
	for _, op := range res.history {
		in, out := op.Input.(Input), op.Output.(Output)
		observation := in.Kind == OpRead || ((in.Kind == OpInsert || in.Kind == OpCAS) && !out.Applied && !out.Unknown)
		if observation && op.Call < res.killedAt {
			dropped++
			continue
		}
		kept = append(kept, op)
	}
	return kept, dropped
}

// dialer opens a session to one node, retrying until a deadline (the node may be down).
type dialer func(deadline time.Time) (*gocql.Session, error)

func connect(addr string, port int, keyspace string) (*gocql.Session, error) {
	c := gocql.NewCluster(addr)
	c.Port = port
	c.Keyspace = keyspace
	c.ProtoVersion = 4
	c.Consistency = gocql.One
	c.SerialConsistency = gocql.Serial
	// Every request goes to this node: no peers from system.peers or from topology events.
	c.DisableInitialHostLookup = true
	c.HostFilter = gocql.WhiteListHostFilter(addr)
	c.NumConns = 1
	c.Timeout = 3 * time.Second
	c.ConnectTimeout = 2 * time.Second
	// No driver retries: a retried conditional write that had applied would report
	// "not applied" and forge a violation.
	c.RetryPolicy = nil
	return c.CreateSession()
}

// connectUntil retries until a session to addr:port opens or the deadline passes.
func connectUntil(addr string, port int, deadline time.Time) (*gocql.Session, error) {
	for {
		sess, err := connect(addr, port, "linz")
		if err == nil || time.Now().After(deadline) {
			return sess, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// dial opens sessions to the one-node server.
func (s *server) dial(deadline time.Time) (*gocql.Session, error) {
	return connectUntil("127.0.0.1", s.ports[0], deadline)
}

// neverSent says whether the driver failed before sending the request: with no retry policy
// it answers ErrNoConnections only when it found no connection to try.
func neverSent(err error) bool {
	return errors.Is(err, gocql.ErrNoConnections)
}

// isServerAnswer says whether err is an error frame from the server (the connection is fine).
func isServerAnswer(err error) bool {
	var re gocql.RequestError
	return errors.As(err, &re)
}

const (
	readCQL   = "SELECT v FROM t WHERE k = ?"
	insertCQL = "INSERT INTO t (k, v) VALUES (?, ?) IF NOT EXISTS"
	casCQL    = "UPDATE t SET v = ? WHERE k = ? IF v = ?"
	writeCQL  = "INSERT INTO t (k, v) VALUES (?, ?)"
)

// execute runs one operation and returns what the client saw.
func execute(sess *gocql.Session, in Input) (Output, error) {
	switch in.Kind {
	case OpRead:
		var v int
		err := sess.Query(readCQL, in.Key).Consistency(gocql.Consistency(gocql.Serial)).Scan(&v)
		if errors.Is(err, gocql.ErrNotFound) {
			return Output{}, nil
		}
		return Output{Exists: err == nil, Value: v}, err
	case OpInsert, OpCAS:
		var q *gocql.Query
		if in.Kind == OpInsert {
			q = sess.Query(insertCQL, in.Key, in.Value)
		} else {
			q = sess.Query(casCQL, in.Value, in.Key, in.From)
		}
		row := map[string]interface{}{}
		applied, err := q.MapScanCAS(row)
		if err != nil {
			return Output{}, err
		}
		out := Output{Applied: applied}
		if v, ok := row["v"].(int); ok && !applied {
			out.Exists, out.Value = true, v
		}
		return out, nil
	case OpWrite:
		return Output{}, sess.Query(writeCQL, in.Key, in.Value).Exec()
	}
	return Output{}, fmt.Errorf("unknown operation kind %d", in.Kind)
}

func createTable(t *testing.T, s *server, options string) {
	c := gocql.NewCluster("127.0.0.1")
	c.Port = s.ports[0]
	c.ProtoVersion = 4
	c.DisableInitialHostLookup = true
	c.Timeout = 20 * time.Second
	sess, err := c.CreateSession()
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer sess.Close()
	for _, stmt := range []string{
		"CREATE KEYSPACE linz WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
		"CREATE TABLE linz.t (k int PRIMARY KEY, v int) " + options,
	} {
		if err := sess.Query(stmt).Exec(); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
}

// runClient issues random operations on the checked keys through one node until end (node
// names it in the history on a cluster). A compare-and-set expects the value this client last
// saw for the key, so that many of them apply. After an unknown outcome the client continues
// under a new id, as a process that crashed would.
func runClient(dial dialer, node int, w workload, rec *recorder, seed int64, values *atomic.Int64, end time.Time) {
	rng := rand.New(rand.NewSource(seed))
	known := map[int]int{}
	clientID := rec.newClientID()
	sess, err := dial(end)
	if err != nil {
		rec.noteError(err)
		return
	}
	defer func() { sess.Close() }()
	for time.Now().Before(end) {
		key := rng.Intn(w.keys)
		in := Input{Key: key, Value: int(values.Add(1)), Node: node}
		last, haveLast := known[key]
		switch r := rng.Float64(); {
		case r < 0.3 || (r >= 0.45 && !haveLast):
			in.Kind = OpRead
		case r < 0.38 && w.plainWritesSameKeys:
			in.Kind = OpWrite
		case r < 0.45 || last == absent:
			in.Kind = OpInsert
		default:
			in.Kind, in.From = OpCAS, last
		}
		call := rec.now()
		out, err := execute(sess, in)
		ret := rec.now()
		if err != nil {
			rec.noteError(err)
			delete(known, key)
			// A failed read had no effect and is left out; so is a request never sent. A
			// failed write that was sent may have applied.
			if neverSent(err) {
				rec.notSent.Add(1)
			} else if in.Kind != OpRead {
				rec.add(porcupine.Operation{ClientId: clientID, Input: in, Call: call, Output: Output{Unknown: true}})
				clientID = rec.newClientID()
			}
			if !isServerAnswer(err) {
				sess.Close()
				if sess, err = dial(end); err != nil {
					rec.noteError(err)
					return
				}
			}
			continue
		}
		rec.add(porcupine.Operation{ClientId: clientID, Input: in, Call: call, Output: out, Return: ret})
		switch {
		case in.Kind == OpRead || ((in.Kind == OpInsert || in.Kind == OpCAS) && !out.Applied):
			if out.Exists {
				known[key] = out.Value
			} else {
				known[key] = absent
			}
		default:
			known[key] = in.Value
		}
	}
}

// runPlainWriter writes rows outside the checked keys until end, reconnecting after errors.
func runPlainWriter(dial dialer, first int, count *atomic.Int64, end time.Time) {
	sess, err := dial(end)
	if err != nil {
		return
	}
	defer func() { sess.Close() }()
	for i := 0; time.Now().Before(end); i++ {
		if err := sess.Query(writeCQL, first+i%1000, i).Exec(); err != nil {
			if !isServerAnswer(err) {
				sess.Close()
				if sess, err = dial(end); err != nil {
					return
				}
			}
			continue
		}
		count.Add(1)
	}
}

// record starts a server, runs the workload (with its kill, if any) and returns the history,
// which ends with one SERIAL read of every key by a fresh client.
func record(t *testing.T, w workload) runResult {
	s := startServer(t)
	createTable(t, s, w.tableOptions)
	rec := &recorder{start: time.Now(), errs: map[string]int{}}
	end := rec.start.Add(w.duration)
	var values, plainWrites atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < w.clients; i++ {
		wg.Go(func() { runClient(s.dial, 0, w, rec, int64(i)+time.Now().UnixNano(), &values, end) })
	}
	for i := 0; i < w.plainWritersOtherKeys; i++ {
		wg.Go(func() { runPlainWriter(s.dial, 1000*(i+1), &plainWrites, end) })
	}
	var killedAt int64
	if w.killAt > 0 {
		time.Sleep(w.killAt)
		killedAt = rec.now()
		s.kill()
		t.Logf("killed sluice (SIGKILL) at %v", time.Since(rec.start).Round(time.Millisecond))
		time.Sleep(200 * time.Millisecond)
		s.restart()
		t.Logf("restarted on the same data directory at %v", time.Since(rec.start).Round(time.Millisecond))
	}
	wg.Wait()
	if !s.alive() {
		t.Fatalf("sluice died during the run:\n%s", s.logTail())
	}
	sess, err := s.dial(time.Now().Add(10 * time.Second))
	if err != nil {
		t.Fatalf("final connect: %v", err)
	}
	defer sess.Close()
	clientID := rec.newClientID()
	for key := 0; key < w.keys; key++ {
		in := Input{Kind: OpRead, Key: key}
		call := rec.now()
		out, err := execute(sess, in)
		if err != nil {
			t.Fatalf("final serial read of k%d: %v", key, err)
		}
		rec.add(porcupine.Operation{ClientId: clientID, Input: in, Call: call, Output: out, Return: rec.now()})
	}
	res := runResult{history: rec.history(), unknown: len(rec.unknown), plainWrites: plainWrites.Load(), notSent: rec.notSent.Load(), errs: rec.errs, killedAt: killedAt}
	return res
}

// summarize logs the history's size and composition.
func summarize(t *testing.T, res runResult) {
	counts := map[OpKind][2]int{} // [applied or read, total]
	for _, op := range res.history {
		in, out := op.Input.(Input), op.Output.(Output)
		c := counts[in.Kind]
		c[1]++
		if out.Applied || in.Kind == OpRead || (in.Kind == OpWrite && !out.Unknown) {
			c[0]++
		}
		counts[in.Kind] = c
	}
	t.Logf("history: %d operations (serial reads %d, inserts %d/%d applied, CAS %d/%d applied, plain writes %d), %d unknown outcomes, %d not sent (no connection), %d plain writes on other keys",
		len(res.history), counts[OpRead][1], counts[OpInsert][0], counts[OpInsert][1],
		counts[OpCAS][0], counts[OpCAS][1], counts[OpWrite][1], res.unknown, res.notSent, res.plainWrites)
	var errs []string
	for msg, n := range res.errs {
		errs = append(errs, fmt.Sprintf("%dx %q", n, msg))
	}
	sort.Strings(errs)
	if len(errs) > 0 {
		t.Logf("client errors: %s", strings.Join(errs, "; "))
	}
}

// visualizationPath is where a failed check's porcupine visualization goes; it outlives the
// test's temporary directory.
func visualizationPath(t *testing.T) string {
	dir := os.Getenv("LINZ_VISUALIZATION_DIR")
	if dir == "" {
		dir = os.TempDir()
	}
	name := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	return filepath.Join(dir, fmt.Sprintf("sluice-linearizability-%s-%d.html", name, os.Getpid()))
}

// check runs porcupine on the history; on anything but Ok it writes the visualization and
// returns its path.
func check(t *testing.T, history []porcupine.Operation) (porcupine.CheckResult, string, porcupine.LinearizationInfo) {
	began := time.Now()
	result, info := porcupine.CheckOperationsVerbose(RegisterModel, history, 60*time.Second)
	t.Logf("porcupine: %s in %v", result, time.Since(began).Round(time.Millisecond))
	if result == porcupine.Ok {
		return result, "", info
	}
	path := visualizationPath(t)
	if err := porcupine.VisualizePath(RegisterModel, info, path); err != nil {
		t.Errorf("writing the visualization: %v", err)
	}
	return result, path, info
}

// requireLinearizable records a run and fails the test unless porcupine finds it linearizable.
func requireLinearizable(t *testing.T, w workload) runResult {
	res := record(t, w)
	summarize(t, res)
	return requireHistoryLinearizable(t, res)
}

// requireHistoryLinearizable fails the test unless porcupine finds res.history linearizable.
func requireHistoryLinearizable(t *testing.T, res runResult) runResult {
	if len(res.history) < 100 {
		t.Fatalf("only %d operations recorded: the run checked too little", len(res.history))
	}
	result, path, info := check(t, res.history)
	if result != porcupine.Ok {
		for _, line := range explainViolation(res.history, info) {
			t.Log(line)
		}
		t.Fatalf("history is not linearizable (porcupine: %s); visualization: %s", result, path)
	}
	return res
}
