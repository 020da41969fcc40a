package linearizability

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// Eight clients, six keys: inserts if not exists, compare-and-sets and SERIAL reads.
func TestLWTHistoryIsLinearizable(t *testing.T) {
	requireLinearizable(t, workload{clients: 8, keys: 6, duration: 6 * time.Second})
}

// The same, while plain writes to other keys of the table load the commit path.
func TestLWTHistoryIsLinearizableWithPlainWritesOnOtherKeys(t *testing.T) {
	requireLinearizable(t, workload{clients: 8, keys: 6, duration: 6 * time.Second, plainWritersOtherKeys: 2})
}

// killRun is the workload of the kill tests: the server is killed with SIGKILL mid-run and
// restarted on the same data directory; clients reconnect, and operations in flight at the kill
// are unknown outcomes.
var killRun = workload{clients: 8, keys: 6, duration: 9 * time.Second, killAt: 4 * time.Second, plainWritersOtherKeys: 2}

// The whole history across a kill -9 and restart must be linearizable: acknowledged writes
// survive, and so does everything observed before the kill (SERIAL reads and conditional writes
// that did not apply answer only once what they read is durable). On a failure the history is
// checked again without the observations made before the kill, to tell a lost acknowledged
// write from an observation of a write that was not durable yet.
func TestLWTHistoryIsLinearizableAcrossKillAndRestart(t *testing.T) {
	res := record(t, killRun)
	summarize(t, res)
	if len(res.history) < 100 {
		t.Fatalf("only %d operations recorded: the run checked too little", len(res.history))
	}
	result, path, info := check(t, res.history)
	if result == porcupine.Ok {
		return
	}
	for _, line := range explainViolation(res.history, info) {
		t.Log(line)
	}
	writesOnly, dropped := withoutObservationsBeforeKill(res)
	writesResult, _, _ := check(t, writesOnly)
	t.Logf("without the %d observations made before the kill: porcupine %s (Ok: only observations of writes not yet durable broke it)", dropped, writesResult)
	t.Fatalf("history is not linearizable (porcupine: %s); visualization: %s", result, path)
}

// With transactional_mode = 'full' plain writes to the checked keys are ordered with the
// conditional ones by their commits, so the history stays linearizable.
func TestTransactionalModeFullPlainWritesAndLWTAreLinearizable(t *testing.T) {
	requireLinearizable(t, workload{
		clients: 8, keys: 6, duration: 6 * time.Second, plainWritesSameKeys: true,
		tableOptions: "WITH transactional_mode = 'full'",
	})
}

// With transactional_mode = 'off' (the default) plain writes keep the client's timestamp and
// last-write-wins: a plain write acknowledged after a conditional write can lose to it. The
// test passes when porcupine rejects the history, showing the check catches it; run on request
// (LINZ_NEGATIVE=1), since a run that happens to lose no write would fail it.
func TestTransactionalModeOffPlainWritesRacingLWT(t *testing.T) {
	if os.Getenv("LINZ_NEGATIVE") != "1" {
		t.Skip("set LINZ_NEGATIVE=1 to run the transactional_mode 'off' control")
	}
	res := record(t, workload{clients: 8, keys: 6, duration: 6 * time.Second, plainWritesSameKeys: true})
	summarize(t, res)
	result, path, info := check(t, res.history)
	t.Logf("transactional_mode 'off', plain writes racing LWT on the same keys: porcupine %s %s", result, path)
	for _, line := range explainViolation(res.history, info) {
		t.Log(line)
	}
	if result == porcupine.Ok {
		t.Errorf("porcupine accepted the history: no lost plain write this run")
	}
}

// explainViolation describes, for each key with no full linearization, the end of porcupine's
// longest partial linearization and the earliest-returning operation it could not place.
func explainViolation(history []porcupine.Operation, info porcupine.LinearizationInfo) []string {
	var lines []string
	partials := info.PartialLinearizationsOperations()
	for p, part := range partitionByKey(history) {
		if p >= len(partials) {
			break
		}
		var longest []porcupine.Operation
		for _, lin := range partials[p] {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
		if len(longest) == len(part) {
			continue
		}
		placed := map[[2]int64]bool{}
		for _, op := range longest {
			placed[[2]int64{op.Call, int64(op.ClientId)}] = true
		}
		var stuck *porcupine.Operation
		for i, op := range part {
			if !placed[[2]int64{op.Call, int64(op.ClientId)}] && (stuck == nil || op.Return < stuck.Return) {
				stuck = &part[i]
			}
		}
		lines = append(lines, fmt.Sprintf("key %d: %d of %d operations linearized; the last ones:", part[0].Input.(Input).Key, len(longest), len(part)))
		for _, op := range longest[max(0, len(longest)-3):] {
			lines = append(lines, fmt.Sprintf("  %s [%d..%d ns]", describeOperation(op.Input, op.Output), op.Call, op.Return))
		}
		if stuck != nil {
			lines = append(lines, fmt.Sprintf("  cannot place next: %s [%d..%d ns]", describeOperation(stuck.Input, stuck.Output), stuck.Call, stuck.Return))
		}
	}
	return lines
}
