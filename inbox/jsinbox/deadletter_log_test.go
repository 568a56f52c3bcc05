package jsinbox

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestDeadLetterWarningsSampled: the first few dead letters of a reason
// are logged one by one, the rest as a count per reason once a minute, and
// what is left is summarised when the consumer stops.
func TestDeadLetterWarningsSampled(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	now := time.Unix(0, 0)
	s := dlSampler{now: func() time.Time { return now }}
	for i := 0; i < 10; i++ {
		s.warn(log, "poison", "id", i)
		now = now.Add(time.Second)
	}
	s.warn(log, "other", "id", 99)
	now = now.Add(time.Minute)
	s.warn(log, "poison", "id", 10) // a minute after the third: summary of 8
	for i := 11; i < 14; i++ {
		s.warn(log, "poison", "id", i)
	}
	s.flush(log)

	var full, summaries []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		if r["msg"] == "jsinbox: dead-lettered" {
			full = append(full, r)
		} else {
			summaries = append(summaries, r)
		}
	}
	if len(full) != 4 { // three "poison", one "other"
		t.Fatalf("%d full warnings, want 4:\n%s", len(full), buf.String())
	}
	if len(summaries) != 2 || summaries[0]["count"] != float64(8) || summaries[1]["count"] != float64(3) || summaries[0]["reason"] != "poison" {
		t.Fatalf("summaries: %v", summaries)
	}
}
