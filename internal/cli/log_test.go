package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"
)

// TestLogsAndFatalLine: durations are strings in JSON logs, /dev/null is
// not a terminal, and the final error is one JSON line when the command
// logs JSON (by flag or JETINBOX_LOG_FORMAT), else "name: message", never
// with a doubled prefix.
func TestLogsAndFatalLine(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	NewLogger(&buf, "json", slog.LevelInfo).Info("x", "timeout", 1500*time.Millisecond)
	if !strings.Contains(buf.String(), `"timeout":"1.5s"`) {
		t.Errorf("duration not a string: %s", buf.String())
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	if IsTerminal(devNull) || logFormat(devNull, "auto") != "json" {
		t.Error("/dev/null taken for a terminal")
	}

	fail := fmt.Errorf("consumer: jsinbox: jsinbox: consume: %w", errors.New("boom"))
	for _, c := range []struct {
		args []string
		env  map[string]string
		def  string
		json bool
	}{
		{[]string{"-log-format", "json"}, nil, "text", true},
		{[]string{"--log-format=json"}, nil, "text", true},
		{nil, map[string]string{"JETINBOX_LOG_FORMAT": "json"}, "text", true},
		{nil, nil, "auto", true}, // a buffer is no terminal
		{[]string{"-log-format=text"}, map[string]string{"JETINBOX_LOG_FORMAT": "json"}, "auto", false},
		{nil, nil, "text", false},
	} {
		var out bytes.Buffer
		ReportError(&out, "consumer", c.args, mapEnv(c.env), c.def, fail)
		line := out.String()
		if strings.Count(line, "consumer:") != 1 || strings.Count(line, "jsinbox:") != 1 {
			t.Errorf("%v %v: doubled prefix: %s", c.args, c.env, line)
		}
		var rec map[string]any
		isJSON := json.Unmarshal([]byte(line), &rec) == nil
		if isJSON != c.json {
			t.Errorf("%v %v: JSON %v, want %v: %s", c.args, c.env, isJSON, c.json, line)
		}
		if isJSON && (rec["level"] != "ERROR" || rec["err"] != "jsinbox: consume: boom" || rec["exit_code"] != float64(1)) {
			t.Errorf("fatal record: %s", line)
		}
		if !isJSON && line != "consumer: jsinbox: consume: boom\n" {
			t.Errorf("fatal line: %q", line)
		}
	}
	var out bytes.Buffer
	ReportError(&out, "consumer", nil, mapEnv(nil), "text", nil)
	if out.Len() != 0 {
		t.Errorf("printed for success: %q", out.String())
	}
}

// TestProgressWriterJSON: under JETINBOX_LOG_FORMAT=json every progress
// line, even one written in pieces, is one JSON record; text passes through.
func TestProgressWriterJSON(t *testing.T) {
	var buf bytes.Buffer
	w := ProgressWriter(&buf, mapEnv(map[string]string{"JETINBOX_LOG_FORMAT": "json"}))
	fmt.Fprint(w, "raw      50000 msgs ")
	fmt.Fprintln(w, "in 1.2s")
	fmt.Fprint(w, "\nnaive    done\n")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 records, got %q", buf.String())
	}
	for i, want := range []string{"raw      50000 msgs in 1.2s", "naive    done"} {
		var rec map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &rec); err != nil || rec["msg"] != want {
			t.Errorf("line %d %q: %v, msg %v, want %q", i, lines[i], err, rec["msg"], want)
		}
	}
	var text bytes.Buffer
	if w := ProgressWriter(&text, mapEnv(nil)); w != io.Writer(&text) {
		t.Error("text format must write progress unchanged")
	}
}
