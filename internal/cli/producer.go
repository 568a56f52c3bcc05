package cli

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetinbox/jetinbox/inbox"
	"github.com/jetinbox/jetinbox/inbox/jsinbox"
	"github.com/jetinbox/jetinbox/internal/jscheck"
	"github.com/jetinbox/jetinbox/internal/pipeline"
	"github.com/jetinbox/jetinbox/internal/shard"
	"github.com/jetinbox/jetinbox/metrics"
)

// Producer publishes intents (generated, or JSONL from a file or stdin) to the
// -stream stream and prints a summary. It exits non-zero, listing them (with
// their input line numbers), if any intent was not published: its retry
// budget ran out, its subject belongs to another stream, or its ID was
// already in the stream with a different payload (a conflict); or if any
// input line was bad.
func Producer(ctx context.Context, args []string, env Env, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := NewFlagSet("producer", "producer publishes intents to JetStream with Nats-Msg-Id = the intent's ID,\n"+
		"retrying with the same ID and jittered backoff. Input: generated load, or JSONL lines\n"+
		`{"id":"...","payload":{...},"subject":"intents.x"} from -input FILE or - (stdin).`, stderr)
	var nf NATSFlags
	nf.Register(fs, env)
	var (
		stream    = StreamFlag(fs, env, "intents stream, created with safe limits if missing; every intent must land in it (env JETINBOX_STREAM)")
		subject   = fs.String("subject", "intents", "subject prefix for generated intents and JSONL lines without a subject")
		input     = fs.String("input", "", "JSONL file to publish, - for stdin; empty generates load")
		count     = fs.Int("count", 10000, "generated intents")
		rate      = fs.Int("rate", 0, "generated intents per second (0: as fast as the in-flight window allows)")
		accounts  = fs.Int("accounts", 1024, "accounts the generated amounts spread over")
		hot       = fs.Bool("hot", false, "put every generated intent on account 1")
		dupFrac   = fs.Float64("dup-fraction", 0, "fraction of generated intents published a second time (same ID, same payload)")
		prefix    = fs.String("prefix", "", "ID prefix for generated intents (default: a random run ID)")
		inFlight  = fs.Int("max-inflight", 4096, "publishes awaiting a PubAck at once")
		batch     = fs.Int("batch", 0, "group commit: most intents per JetStream atomic batch, at most 1000; the intents handed over while one batch is stored go out together as the next, one fsync and one PubAck per batch, which is what counts with sync_interval: always; 0: 256; 1 publishes each intent on its own")
		ackTO     = fs.Duration("ack-timeout", 5*time.Second, "wait for one PubAck before retrying")
		attempts  = fs.Int("retry-attempts", 10, "retries per intent before it is reported as failed")
		retryFor  = fs.Duration("retry-for", 100*time.Second, "give an intent up after this long in all, PubAck waits included: keep it inside the stream's duplicate window (2 minutes by default), or a late retry of a publish that did land is stored twice")
		replicas  = fs.Int("replicas", 1, "stream replicas when creating it")
		window    = fs.Duration("duplicate-window", jsinbox.DefaultDuplicateWindow, "stream duplicate window when creating it; must cover the retry horizon")
		logFormat = fs.String("log-format", env.Or("JETINBOX_LOG_FORMAT", "auto"), "json, text or auto")
		httpAddr  = fs.String("http", env("JETINBOX_PRODUCER_HTTP_ADDR"), "address for /metrics while publishing (env JETINBOX_PRODUCER_HTTP_ADDR); empty disables")
		shards    = fs.String("shards", env("JETINBOX_SHARDS"), "shard map file of a partitioned stream (env JETINBOX_SHARDS): publish to its stream, each intent on "+
			"<subject>.<key of its ID>.<kind>, the kind being what follows -subject (the map's) in a generated or JSONL subject")
	)
	var envErrs []error
	maxBytes, dlqBytes := envSize(env, "JETINBOX_STREAM_MAX_BYTES", &envErrs), envSize(env, "JETINBOX_DLQ_MAX_BYTES", &envErrs)
	fs.Var(&maxBytes, "stream-max-bytes", "intents stream MaxBytes when creating it, e.g. 16GiB or plain bytes; 0: 16GiB (env JETINBOX_STREAM_MAX_BYTES)")
	fs.Var(&dlqBytes, "dlq-max-bytes", "dead-letter stream MaxBytes when creating it, e.g. 1GiB; 0: 1GiB (env JETINBOX_DLQ_MAX_BYTES)")
	msgSize := envSize(env, "JETINBOX_STREAM_MAX_MSG_SIZE", &envErrs)
	fs.Var(&msgSize, "stream-max-msg-size", fmt.Sprintf("intents stream's largest message (headers included) when creating it; the dead-letter stream gets %d bytes more; 0: %s (env JETINBOX_STREAM_MAX_MSG_SIZE)",
		jsinbox.DeadLetterHeadroom, ptr(Size(jsinbox.DefaultMaxMsgSize)).String()))
	maxMsgs := fs.Int64("stream-max-msgs", envInt64(env, "JETINBOX_STREAM_MAX_MSGS", &envErrs), "intents stream MaxMsgs when creating it; 0: 50 million (env JETINBOX_STREAM_MAX_MSGS)")
	maxAge := fs.Duration("stream-max-age", envDuration(env, "JETINBOX_STREAM_MAX_AGE", 0, &envErrs),
		"intents stream MaxAge when creating it, part of the replay horizon; 0: 168h (env JETINBOX_STREAM_MAX_AGE)")
	w := defaultWaits()
	w.register(fs)
	fs.DurationVar(&w.publish.Base, "retry-base", w.publish.Base, "base delay of a publish retry")
	fs.DurationVar(&w.publish.Cap, "retry-cap", w.publish.Cap, "longest delay between publish retries")
	if err := Parse(fs, args); err != nil {
		return err
	}
	if len(envErrs) > 0 {
		return UsageError{Err: errors.Join(envErrs...)}
	}
	w = w.resolved()
	retry := w.publish
	retry.MaxAttempts = *attempts
	retry.MaxElapsed = *retryFor
	if err := nf.Validate(); err != nil {
		return UsageError{Err: err}
	}
	if err := retry.Validate(); err != nil {
		return UsageError{Err: err}
	}
	if *batch < 0 || *batch > jsinbox.MaxBatch {
		return UsageError{Err: fmt.Errorf("-batch must be within [0, %d]", jsinbox.MaxBatch)}
	}
	if *dupFrac < 0 || *dupFrac > 1 {
		return UsageError{Err: errors.New("-dup-fraction must be within [0, 1]")}
	}
	var bad checks
	bad.atLeast("count", *count, 0) // 0 creates the streams and publishes nothing
	bad.atLeast("rate", *rate, 0)
	bad.atLeast("accounts", *accounts, 1)
	bad.atLeast("max-inflight", *inFlight, 1)
	bad.positive("ack-timeout", *ackTO)
	bad.atLeast("retry-attempts", *attempts, 0)
	if *retryFor < 0 { // 0: no limit but -retry-attempts
		bad.positive("retry-for", *retryFor)
	}
	bad.within("replicas", *replicas, 1, 5)
	bad.positive("duplicate-window", *window)
	bad.atLeast("stream-max-msgs", int(min(*maxMsgs, math.MaxInt)), 0)
	bad.within("stream-max-msg-size", int(min(int64(msgSize), math.MaxInt32)), 0, math.MaxInt32-jsinbox.DeadLetterHeadroom)
	if *maxAge < 0 {
		bad.positive("stream-max-age", *maxAge)
	}
	bad.add(CheckLogFormat(*logFormat))
	bad.add(CheckListenAddr("http", *httpAddr))
	if err := bad.err(); err != nil {
		return err
	}
	var sm *shard.Map
	if *shards != "" {
		// The map names the stream and the subject prefix; a flag that
		// says otherwise is a mistake, not an override.
		var err error
		if sm, err = shard.Load(*shards); err != nil {
			return UsageError{Err: fmt.Errorf("-shards: %w", err)}
		}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if set["stream"] && *stream != sm.Stream || set["subject"] && *subject != sm.Subject {
			return UsageError{Err: fmt.Errorf("-shards %s publishes to stream %s under %s.: drop -stream and -subject", *shards, sm.Stream, sm.Subject)}
		}
		*stream, *subject = sm.Stream, sm.Subject
	}
	log := NewLogger(stderr, *logFormat, slog.LevelInfo)

	nc, js, err := nf.Connect("jetinbox-producer", w.natsReconnect, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	sc := jsinbox.StreamConfig{
		Name: *stream, Subjects: []string{*subject + ".>"}, Replicas: *replicas, DuplicateWindow: *window,
		MaxBytes: int64(maxBytes), MaxMsgs: *maxMsgs, MaxAge: *maxAge, DeadLetterMaxBytes: int64(dlqBytes), MaxMsgSize: int32(min(int64(msgSize), math.MaxInt32)),
	}
	var st jetstream.Stream
	if sm != nil {
		// The stream with its transform (created if missing, like the
		// plain one), refused if its partitions are not the map's.
		if err = sm.EnsureStream(ctx, js, sc); err == nil {
			st, err = js.Stream(ctx, sm.Stream)
		}
	} else {
		st, err = jsinbox.EnsureStream(ctx, js, sc)
	}
	if err != nil {
		return err
	}
	// Only what applies to a producer: its retries against the duplicate
	// window of the stream as it is (an existing one may keep a longer
	// window than -duplicate-window asks for).
	for _, w := range jscheck.LintPublisher(jscheck.PublisherTiming{PublishRetry: &retry, PublishTimeout: *ackTO, DuplicateWindow: st.CachedInfo().Config.Duplicates}) {
		log.Warn("config: " + w)
	}
	tp, stopTracing, err := tracing(ctx, env, "jetinbox-producer", stderr)
	if err != nil {
		return err
	}
	defer stopTracing(context.WithoutCancel(ctx)) //nolint:errcheck // best effort at exit
	pcfg := jsinbox.PublisherConfig{Stream: *stream, MaxInFlight: *inFlight, Batch: *batch, AckTimeout: *ackTO,
		Retry: retry, Logger: log, TracerProvider: tp}
	if sm != nil {
		pcfg.StoredSubject = storedSubject(sm)
	}
	pub, err := jsinbox.NewPublisher(js, pcfg)
	if err != nil {
		return UsageError{Err: err}
	}
	defer pub.Close()
	if *httpAddr != "" {
		reg := prometheus.NewRegistry()
		if _, err := metrics.NewPublisher(reg, pub); err != nil {
			return err
		}
		srv, err := serveHTTP(*httpAddr, nil, nc, reg, log)
		if err != nil {
			return err
		}
		defer srv.Close()
	}

	start := time.Now()
	var badLines int
	summary := func(prefix string) {
		s := pub.Stats()
		elapsed := time.Since(start)
		fmt.Fprintf(stdout, "%spublished %d (%.0f/s)  server-side duplicates %d  conflicts %d  retries %d  failed %d  bad input lines %d",
			prefix, s.Published, float64(s.Published)/elapsed.Seconds(), s.Duplicates, s.Conflicts, s.Retries, s.Failed, badLines)
		if *batch != 1 {
			fmt.Fprintf(stdout, "  atomic batches %d (refused and published one by one %d)", s.Batches, s.BatchFallbacks)
		}
		fmt.Fprintln(stdout)
	}
	// interrupted reports the counts so far when a signal (ctx) ends the run.
	interrupted := func(err error) error {
		if ctx.Err() == nil {
			return err
		}
		summary("interrupted: ")
		return fmt.Errorf("interrupted before every intent was published and acknowledged (counts so far above): %w", err)
	}
	// lineOf maps an intent (its ID and payload) to the input line that
	// first gave it, so that failures are reported by line.
	lineOf := map[lineKey]int{}
	if *input != "" {
		r := stdin
		if *input != "-" {
			f, err := os.Open(*input)
			if err != nil {
				return UsageError{Err: fmt.Errorf("-input: %w", err)}
			}
			defer f.Close()
			r = f
		}
		badLines, err = publishJSONL(ctx, pub, r, *subject, keyed(sm), stderr, lineOf)
		if err != nil {
			return interrupted(err)
		}
	} else {
		if *prefix == "" {
			*prefix = "gen-" + strconv.FormatUint(rand.Uint64()>>24, 36)
		}
		intents := pipeline.Generate(pipeline.Load{Count: *count, Accounts: *accounts, HotAccount: *hot, Prefix: *prefix, Subject: *subject, Seed: rand.Uint64()})
		if k := keyed(sm); k != nil {
			for i := range intents {
				intents[i] = k(intents[i])
			}
		}
		if err := publishGenerated(ctx, pub, intents, *rate, *dupFrac); err != nil {
			return interrupted(err)
		}
	}
	if err := pub.Flush(ctx); err != nil {
		return interrupted(fmt.Errorf("waiting for the PubAcks: %w", err))
	}
	summary("")
	s := pub.Stats()
	var problems []string
	if f := pub.Failures(); len(f) > 0 {
		reportFailures(stderr, f, lineOf)
		p := fmt.Sprintf("%d intents not published", len(f))
		if s.Conflicts > 0 {
			p += fmt.Sprintf(" (%d reused an ID the stream holds with a different payload)", s.Conflicts)
		}
		problems = append(problems, p)
	}
	if badLines > 0 {
		problems = append(problems, fmt.Sprintf("%d input lines rejected (see above); the good lines were published", badLines))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// lineKey is an intent as the publisher's failures name it.
type lineKey struct {
	id string
	fp [32]byte
}

// reportFailures lists the intents not published, JSONL ones by input line
// (lineOf) like rejected lines.
func reportFailures(w io.Writer, f []jsinbox.Failure, lineOf map[lineKey]int) {
	slices.SortStableFunc(f, func(a, b jsinbox.Failure) int {
		return cmp.Compare(lineOf[lineKey{a.ID, a.Fingerprint}], lineOf[lineKey{b.ID, b.Fingerprint}])
	})
	fmt.Fprintf(w, "not published (%d):\n", len(f))
	for _, x := range f {
		what := "not published"
		if errors.Is(x.Err, inbox.ErrConflict) {
			what = "conflict"
		}
		if line := lineOf[lineKey{x.ID, x.Fingerprint}]; line > 0 {
			fmt.Fprintf(w, "line %d: %s: id %s after %d attempts: %v\n", line, what, x.ID, x.Attempts, x.Err)
		} else {
			fmt.Fprintf(w, "  %s: id %s after %d attempts: %v\n", what, x.ID, x.Attempts, x.Err)
		}
	}
}

func publishGenerated(ctx context.Context, pub *jsinbox.Publisher, intents []inbox.Intent, rate int, dupFrac float64) error {
	var tick *time.Ticker
	per := 1
	if rate > 0 {
		// Tick at most 1000 times a second; publish a small burst per tick.
		interval := time.Second / time.Duration(rate)
		if interval < time.Millisecond {
			per = rate / 1000
			interval = time.Millisecond
		}
		tick = time.NewTicker(interval)
		defer tick.Stop()
	}
	dups := int(float64(len(intents)) * dupFrac)
	for i := 0; i < len(intents)+dups; i++ {
		in := intents[i%len(intents)]
		if tick != nil && i%per == 0 {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := pub.PublishAsync(ctx, in); err != nil {
			return err
		}
	}
	return nil
}

// jsonlLine is one input line. The producer never invents an ID: a line
// without a valid one is rejected with its line number.
type jsonlLine struct {
	ID      string          `json:"id"`
	Subject string          `json:"subject"`
	Payload json.RawMessage `json:"payload"`
}

// maxLine is the longest JSONL line the producer reads; a longer one is
// reported with its number and skipped.
const maxLine = 1 << 20

// utf8BOM may start a file saved by some editors; it is skipped.
var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

func publishJSONL(ctx context.Context, pub *jsinbox.Publisher, r io.Reader, subject string, keyed func(inbox.Intent) inbox.Intent, stderr io.Writer, lineOf map[lineKey]int) (bad int, err error) {
	// Lines are read in a goroutine, so that a signal ends a run waiting
	// on a quiet stdin.
	type read struct {
		raw     []byte
		tooLong bool
		err     error
	}
	lines := make(chan read)
	done := make(chan struct{})
	defer close(done)
	go func() {
		br := bufio.NewReaderSize(r, 64<<10)
		for {
			raw, tooLong, err := readLine(br, maxLine)
			select {
			case lines <- read{raw, tooLong, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	n := 0
	for {
		var l read
		select {
		case l = <-lines:
		case <-ctx.Done():
			return bad, ctx.Err()
		}
		if len(l.raw) > 0 || l.tooLong || l.err == nil {
			n++
			if n == 1 {
				l.raw = bytes.TrimPrefix(l.raw, utf8BOM)
			}
			if l.tooLong {
				bad++
				fmt.Fprintf(stderr, "line %d: longer than %d bytes; skipped\n", n, maxLine)
			} else if line := bytes.TrimSpace(l.raw); len(line) > 0 {
				in, err := parseLine(line, subject)
				if err != nil {
					bad++
					fmt.Fprintf(stderr, "line %d: %v\n", n, err)
				} else {
					if keyed != nil {
						in = keyed(in)
					}
					k := lineKey{in.ID, inbox.Fingerprint(in.Payload)}
					if _, seen := lineOf[k]; !seen {
						lineOf[k] = n // failures are reported by line
					}
					if err := pub.PublishAsync(ctx, in); err != nil {
						return bad, err
					}
				}
			}
		}
		if l.err != nil {
			if errors.Is(l.err, io.EOF) {
				return bad, nil
			}
			return bad, fmt.Errorf("line %d: %w", n+1, l.err)
		}
	}
}

// readLine returns the next line without its newline; one longer than max
// is read to its end and dropped (tooLong). err is io.EOF after the last
// line, with or without a final newline.
func readLine(br *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(chunk) > max+1 { // +1: the newline
				tooLong, buf = true, nil
			} else {
				buf = append(buf, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimSuffix(buf, []byte("\n")), tooLong, err
	}
}

func parseLine(line []byte, subject string) (inbox.Intent, error) {
	// JSON decoding would turn invalid UTF-8, and escapes of lone
	// surrogates, into U+FFFD: an ID other than the one the line holds.
	if !utf8.Valid(line) {
		return inbox.Intent{}, errors.New("not valid UTF-8")
	}
	var l jsonlLine
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return inbox.Intent{}, fmt.Errorf("not a JSON object with id and payload: %w", err)
	}
	if dec.More() {
		return inbox.Intent{}, errors.New("trailing data after the JSON object")
	}
	if strings.ContainsRune(l.ID, utf8.RuneError) && !bytes.Contains(line, []byte("\uFFFD")) && !bytes.Contains(bytes.ToLower(line), []byte(`\ufffd`)) {
		return inbox.Intent{}, errors.New("id: an escape that is not a valid UTF-16 character (the producer never rewrites IDs)")
	}
	if err := inbox.ValidateID(l.ID); err != nil {
		return inbox.Intent{}, fmt.Errorf("id: %w (the producer never invents IDs)", err)
	}
	if len(l.Payload) == 0 || string(l.Payload) == "null" {
		return inbox.Intent{}, errors.New("payload is missing")
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, l.Payload); err != nil {
		return inbox.Intent{}, fmt.Errorf("payload: %w", err)
	}
	if l.Subject == "" {
		l.Subject = subject + ".jsonl"
	} else if !strings.HasPrefix(l.Subject, subject+".") || strings.ContainsAny(l.Subject, " \t\r\n*>") {
		return inbox.Intent{}, fmt.Errorf("subject %q is not a literal subject under %s.", l.Subject, subject)
	}
	return inbox.Intent{ID: l.ID, Subject: l.Subject, Payload: compact.Bytes()}, nil
}

func ptr[T any](v T) *T { return &v }

// keyed returns what puts an intent on a partitioned stream: its subject
// "<prefix>.<kind>" becomes "<prefix>.<key of its ID>.<kind>", which the
// stream's transform stores in the ID's partition, the one the consumers'
// binding check accepts. nil without a map.
func keyed(m *shard.Map) func(inbox.Intent) inbox.Intent {
	if m == nil {
		return nil
	}
	return func(in inbox.Intent) inbox.Intent {
		in.Subject = shard.PublishSubject(m.Subject, in.ID, strings.TrimPrefix(in.Subject, m.Subject+"."))
		return in
	}
}

// storedSubject maps a subject published on a partitioned stream to the
// one the stream stores: the transform inserts the key's partition after
// the prefix. A duplicate's stored copy is compared with that.
func storedSubject(m *shard.Map) func(string) string {
	return func(subject string) string {
		tail, ok := strings.CutPrefix(subject, m.Subject+".")
		key, rest, ok2 := strings.Cut(tail, ".")
		if !ok || !ok2 {
			return subject // not a keyed subject: the stream does not capture it
		}
		return m.Subject + "." + strconv.Itoa(shard.Partition(key, m.Partitions)) + "." + key + "." + rest
	}
}
