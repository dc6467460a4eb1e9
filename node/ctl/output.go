package ctl

import (
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"
)

// outputFlag is -o for the commands that print a table: wide, json or
// yaml (default: the table).
func outputFlag() cli.Flag { return outputFlagOf("a table", "wide", "json", "yaml") }

// textOutputFlag is -o for the commands that print text: json or yaml
// (default: the text).
func textOutputFlag() cli.Flag { return outputFlagOf("text", "json", "yaml") }

// outputFlagOf is -o, refusing any format but formats before the command
// runs.
func outputFlagOf(def string, formats ...string) cli.Flag {
	want := strings.Join(formats[:len(formats)-1], ", ") + " or " + formats[len(formats)-1]
	return &cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "output format: " + want + " (default: " + def + ")",
		Action: func(_ *cli.Context, f string) error {
			if f != "" && !slices.Contains(formats, f) {
				return fmt.Errorf("output format %q: want %s", f, want)
			}
			return nil
		}}
}

// table is a kubectl-style table: the Wide columns only with -o wide.
type table struct {
	Columns, Wide []string
	rows          [][]string
}

// add appends a row: values for Columns, then for Wide.
func (t *table) add(values ...any) {
	row := make([]string, len(values))
	for i, v := range values {
		row[i] = cell(v)
	}
	t.rows = append(t.rows, row)
}

func cell(v any) string {
	switch v := v.(type) {
	case string:
		if v == "" {
			return "<none>"
		}
		return v
	case metav1.Time:
		if v.IsZero() {
			return "<unknown>"
		}
		return duration.HumanDuration(time.Since(v.Time))
	case *metav1.Time:
		if v == nil {
			return "<unknown>"
		}
		return cell(*v)
	case []string:
		if len(v) == 0 {
			return "<none>"
		}
		return strings.Join(v, ",")
	case bool:
		if v {
			return "yes"
		}
		return "no"
	}
	return fmt.Sprint(v)
}

func (t *table) write(w io.Writer, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	cols := t.Columns
	if wide {
		cols = append(append([]string(nil), t.Columns...), t.Wide...)
	}
	fmt.Fprintln(tw, strings.Join(cols, "\t"))
	for _, r := range t.rows {
		if len(r) > len(cols) {
			r = r[:len(cols)]
		}
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// print writes obj as JSON or YAML, or the table (wide with -o wide).
// An empty list prints as [] (not null).
func print(c *cli.Context, obj any, t *table) error {
	w := c.App.Writer
	if v := reflect.ValueOf(obj); v.Kind() == reflect.Slice && v.IsNil() {
		obj = reflect.MakeSlice(v.Type(), 0, 0).Interface()
	}
	switch f := c.String("output"); f {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(obj)
	case "yaml":
		b, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	case "", "wide":
		if t == nil {
			return fmt.Errorf("no table for this output; use -o json or -o yaml")
		}
		if len(t.rows) == 0 {
			fmt.Fprintln(c.App.ErrWriter, "No resources found.")
			return nil
		}
		return t.write(w, f == "wide")
	default:
		return fmt.Errorf("output format %q: want wide, json or yaml", f)
	}
}
