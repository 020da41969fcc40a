// Package linearizability records histories of lightweight transactions (LWT) against the real
// `sluice serve` binary and checks them with porcupine, an existing linearizability checker.
package linearizability

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// absent is the register state of a key with no row; every value the workload writes is positive.
const absent = -1

// OpKind names one kind of operation on a key's register.
type OpKind uint8

const (
	// OpRead is `SELECT v ... WHERE k = ?` at SERIAL consistency.
	OpRead OpKind = iota
	// OpInsert is `INSERT ... VALUES (k, v) IF NOT EXISTS`.
	OpInsert
	// OpCAS is `UPDATE ... SET v = To WHERE k = ? IF v = From`.
	OpCAS
	// OpWrite is a plain (non-conditional) `INSERT`, last-write-wins.
	OpWrite
)

// Input is what a client asked for.
type Input struct {
	Kind  OpKind
	Key   int
	Value int // written by OpInsert, OpWrite and OpCAS (its new value)
	From  int // expected by OpCAS
	Node  int // the cluster node that served it (0 on one node); the model ignores it
}

// Output is what the client saw. Unknown marks an operation whose outcome the client does not
// know (a timeout or a lost connection): it may or may not have taken effect.
type Output struct {
	Unknown bool
	Applied bool // OpInsert, OpCAS
	Exists  bool // OpRead: a row was read; OpInsert/OpCAS not applied: the `[applied]` row had v
	Value   int  // the value read, or the v of the `[applied]` row
}

// seenMatches says whether a read value (exists, value) is the register state st.
func seenMatches(st int, exists bool, value int) bool {
	if !exists {
		return st == absent
	}
	return st == value
}

// step is the sequential specification of one key: a compare-and-set register that starts absent.
// An unknown outcome is legal in every state; it moves the state as if it took effect, and since
// its return is placed after every other operation the checker may also order it last, which is
// the case where it did not take effect.
func step(state, input, output interface{}) (bool, interface{}) {
	st := state.(int)
	in := input.(Input)
	out := output.(Output)
	switch in.Kind {
	case OpRead:
		return out.Unknown || seenMatches(st, out.Exists, out.Value), st
	case OpInsert:
		if st == absent {
			return out.Unknown || out.Applied, in.Value
		}
		return out.Unknown || (!out.Applied && seenMatches(st, out.Exists, out.Value)), st
	case OpCAS:
		if st == in.From {
			return out.Unknown || out.Applied, in.Value
		}
		return out.Unknown || (!out.Applied && seenMatches(st, out.Exists, out.Value)), st
	case OpWrite:
		return true, in.Value
	}
	return false, st
}

// partitionByKey splits a history into one sub-history per key (P-compositionality).
func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[int][]porcupine.Operation{}
	var keys []int
	for _, op := range history {
		k := op.Input.(Input).Key
		if _, seen := byKey[k]; !seen {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], op)
	}
	parts := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, byKey[k])
	}
	return parts
}

func describeSeen(exists bool, value int) string {
	if !exists {
		return "null"
	}
	return fmt.Sprint(value)
}

func describeOperation(input, output interface{}) string {
	in := input.(Input)
	if in.Node > 0 {
		return fmt.Sprintf("%s (node %d)", describeOnNode(in, output.(Output)), in.Node)
	}
	return describeOnNode(in, output.(Output))
}

// describeOnNode describes an operation without the node that served it.
func describeOnNode(in Input, out Output) string {
	result := func() string {
		switch {
		case out.Unknown:
			return "unknown"
		case out.Applied:
			return "applied"
		default:
			return "not applied, saw " + describeSeen(out.Exists, out.Value)
		}
	}
	switch in.Kind {
	case OpRead:
		if out.Unknown {
			return fmt.Sprintf("k%d: serial read -> unknown", in.Key)
		}
		return fmt.Sprintf("k%d: serial read -> %s", in.Key, describeSeen(out.Exists, out.Value))
	case OpInsert:
		return fmt.Sprintf("k%d: insert %d if not exists -> %s", in.Key, in.Value, result())
	case OpCAS:
		return fmt.Sprintf("k%d: set %d if v = %s -> %s", in.Key, in.Value, describeSeen(in.From != absent, in.From), result())
	case OpWrite:
		if out.Unknown {
			return fmt.Sprintf("k%d: plain write %d -> unknown", in.Key, in.Value)
		}
		return fmt.Sprintf("k%d: plain write %d", in.Key, in.Value)
	}
	return "invalid"
}

// RegisterModel is a compare-and-set register per key, partitioned by key.
var RegisterModel = porcupine.Model{
	Partition:         partitionByKey,
	Init:              func() interface{} { return absent },
	Step:              step,
	Hash:              func(state interface{}) uint64 { return uint64(state.(int)) },
	DescribeOperation: describeOperation,
	DescribeState: func(state interface{}) string {
		return describeSeen(state.(int) != absent, state.(int))
	},
}
