package netpol

import (
	"fmt"
	"strings"
)

// Matrix is a truth table of connectivity between Pods for one port and
// protocol: rows are sources, columns destinations, a cell is true when
// the connection is allowed.
type Matrix struct {
	Pods  []PodID
	cells []bool // row-major, len(Pods)²
}

// NewMatrix returns a matrix over pods with every cell set to def.
func NewMatrix(pods []PodID, def bool) *Matrix {
	m := &Matrix{Pods: append([]PodID(nil), pods...), cells: make([]bool, len(pods)*len(pods))}
	for i := range m.cells {
		m.cells[i] = def
	}
	return m
}

// Set sets cell (from, to) by Pod index.
func (m *Matrix) Set(from, to int, v bool) { m.cells[from*len(m.Pods)+to] = v }

// Get returns cell (from, to) by Pod index.
func (m *Matrix) Get(from, to int) bool { return m.cells[from*len(m.Pods)+to] }

// Index returns the index of id, or -1.
func (m *Matrix) Index(id PodID) int {
	for i, p := range m.Pods {
		if p == id {
			return i
		}
	}
	return -1
}

// Mismatches counts the cells where m and o differ; matrices over
// different Pods differ everywhere.
func (m *Matrix) Mismatches(o *Matrix) int {
	if len(m.cells) != len(o.cells) {
		return len(m.cells) + len(o.cells)
	}
	n := 0
	for i := range m.cells {
		if m.cells[i] != o.cells[i] {
			n++
		}
	}
	return n
}

// Count returns the number of allowed cells.
func (m *Matrix) Count() int {
	n := 0
	for _, c := range m.cells {
		if c {
			n++
		}
	}
	return n
}

// Pairs returns the (from, to) index pairs whose cell equals v.
func (m *Matrix) Pairs(v bool) [][2]int {
	var out [][2]int
	for i := range m.Pods {
		for j := range m.Pods {
			if m.Get(i, j) == v {
				out = append(out, [2]int{i, j})
			}
		}
	}
	return out
}

// String renders the table with "." for allowed and "X" for denied, rows
// from, columns to, like the upstream suite's reachability tables.
func (m *Matrix) String() string {
	return m.render(func(i, j int) string {
		if m.Get(i, j) {
			return "."
		}
		return "X"
	})
}

func (m *Matrix) render(cell func(i, j int) string) string {
	w := 5
	for _, p := range m.Pods {
		if l := len(p.String()); l+1 > w {
			w = l + 1
		}
	}
	var b strings.Builder
	line := func(head string, cells func(j int) string) {
		var l strings.Builder
		fmt.Fprintf(&l, "%-*s", w, head)
		for j := range m.Pods {
			fmt.Fprintf(&l, " %-*s", w, cells(j))
		}
		b.WriteString(strings.TrimRight(l.String(), " ") + "\n")
	}
	line("-", func(j int) string { return m.Pods[j].String() })
	for i, p := range m.Pods {
		line(p.String(), func(j int) string { return cell(i, j) })
	}
	return b.String()
}

// Diff renders want against got: both tables and a comparison table where
// "." marks agreement and "X" a mismatch. It returns "" when they agree.
func Diff(what string, want, got *Matrix) string {
	n := want.Mismatches(got)
	if n == 0 {
		return ""
	}
	if len(want.cells) != len(got.cells) {
		return fmt.Sprintf("%s: tables over different Pods: want %v, got %v", what, want.Pods, got.Pods)
	}
	cmp := want.render(func(i, j int) string {
		if want.Get(i, j) == got.Get(i, j) {
			return "."
		}
		return "X"
	})
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d of %d cells differ\nexpected (rows from, columns to; . allowed, X denied):\n%s", what, n, len(want.cells), want)
	fmt.Fprintf(&b, "observed:\n%s", got)
	fmt.Fprintf(&b, "comparison (. agrees, X differs):\n%s", cmp)
	return b.String()
}
