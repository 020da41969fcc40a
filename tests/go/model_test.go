package linearizability

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

func op(client int, in Input, call int64, out Output, ret int64) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
}

// A history that is linearizable, and the forgeries below that break it in one place each.
func linearizableHistory() []porcupine.Operation {
	return []porcupine.Operation{
		op(0, Input{Kind: OpInsert, Key: 1, Value: 1}, 0, Output{Applied: true}, 10),
		op(1, Input{Kind: OpInsert, Key: 1, Value: 2}, 5, Output{Exists: true, Value: 1}, 15),
		op(0, Input{Kind: OpCAS, Key: 1, From: 1, Value: 3}, 20, Output{Applied: true}, 30),
		op(1, Input{Kind: OpCAS, Key: 1, From: 1, Value: 4}, 25, Output{Exists: true, Value: 3}, 35),
		op(2, Input{Kind: OpRead, Key: 1}, 40, Output{Exists: true, Value: 3}, 50),
		op(2, Input{Kind: OpRead, Key: 2}, 40, Output{}, 50),
	}
}

func TestForgedHistoriesAreRejected(t *testing.T) {
	if !porcupine.CheckOperations(RegisterModel, linearizableHistory()) {
		t.Fatal("the unforged history must be linearizable")
	}
	forgeries := map[string]func(h []porcupine.Operation){
		// The SERIAL read began after the CAS to 3 completed, yet returned the overwritten 1.
		"stale serial read": func(h []porcupine.Operation) { h[4].Output = Output{Exists: true, Value: 1} },
		// Both inserts applied: the row existed for the second.
		"two inserts applied": func(h []porcupine.Operation) { h[1].Output = Output{Applied: true} },
		// A CAS that did not apply must report the value it saw.
		"wrong [applied] row": func(h []porcupine.Operation) { h[3].Output = Output{Exists: true, Value: 7} },
		// A read of a key never written must find no row.
		"phantom row": func(h []porcupine.Operation) { h[5].Output = Output{Exists: true, Value: 1} },
	}
	for name, forge := range forgeries {
		h := linearizableHistory()
		forge(h)
		if porcupine.CheckOperations(RegisterModel, h) {
			t.Errorf("%s: porcupine accepted a non-linearizable history", name)
		}
	}
}

// An unknown outcome (its return after the history's last event) may have applied or not, but
// never both: reads seeing it applied and then not applied are rejected.
func TestUnknownOutcomes(t *testing.T) {
	unknownCAS := op(0, Input{Kind: OpCAS, Key: 1, From: 1, Value: 9}, 20, Output{Unknown: true}, 1000)
	base := []porcupine.Operation{
		op(1, Input{Kind: OpInsert, Key: 1, Value: 1}, 0, Output{Applied: true}, 10),
		unknownCAS,
	}
	read := func(call int64, value int) porcupine.Operation {
		return op(2, Input{Kind: OpRead, Key: 1}, call, Output{Exists: true, Value: value}, call+5)
	}
	cases := []struct {
		name  string
		reads []porcupine.Operation
		ok    bool
	}{
		{"took effect", []porcupine.Operation{read(30, 9), read(40, 9)}, true},
		{"did not take effect", []porcupine.Operation{read(30, 1), read(40, 1)}, true},
		{"took effect late", []porcupine.Operation{read(30, 1), read(40, 9)}, true},
		{"took effect, then undone", []porcupine.Operation{read(30, 9), read(40, 1)}, false},
	}
	for _, c := range cases {
		h := append(append([]porcupine.Operation(nil), base...), c.reads...)
		if got := porcupine.CheckOperations(RegisterModel, h); got != c.ok {
			t.Errorf("%s: porcupine said linearizable = %v, want %v", c.name, got, c.ok)
		}
	}
}
