package shard

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/jetinbox/jetinbox/inbox"
)

// Map is the shard map: the sharded stream, how many partitions its
// transform makes, the scope of the effect, and which shard owns which
// partition. Each partition has a durable of its own, named after the
// partition and never after its shard, so that moving a partition hands
// its durable (and its place in the stream) to the next shard as it is.
//
// The map file says where partitions start; once they run, each shard's
// database holds which partitions it owns (see [Migrate]), and
// `jetinbox partitions move` changes both.
type Map struct {
	// Stream is the sharded intents stream. Default "PINTENTS".
	Stream string `json:"stream"`
	// Subject is the prefix producers publish under, before the key
	// token: "<Subject>.<key>.<kind…>". Default "pintents".
	Subject string `json:"subject"`
	// Partitions is the partition count of the stream's transform.
	// Default 64; it can never change for a stream.
	Partitions int `json:"partitions"`
	// Scope is the inbox scope, the effect's identity: one for all shards,
	// since a partition's inbox rows move between shards with it.
	// Default "ledger".
	Scope string `json:"scope"`
	// DurablePrefix names the partition durables: "<prefix>_p<NN>".
	// Default: the scope.
	DurablePrefix string `json:"durable_prefix"`
	// ShardDurables, if true, gives each shard one durable,
	// "<prefix>_s_<shard>", filtered on the partitions it owns, in place
	// of a durable per partition. The server then looks at each message
	// once per shard instead of once per partition. A partition moved
	// between shards is handed over by a hand-off durable (see [Move]).
	ShardDurables bool `json:"shard_durables,omitempty"`
	// Shards, each with its database and the partitions it starts with.
	Shards []Shard `json:"shards"`
}

// Shard is one shard: a name, a database (a PostgreSQL primary of its
// own) and its partitions.
type Shard struct {
	Name string `json:"name"`
	// DatabaseURL is the shard's PostgreSQL URL, or DatabaseURLEnv the
	// environment variable that holds it (keeps passwords out of the
	// file).
	DatabaseURL    string `json:"database_url,omitempty"`
	DatabaseURLEnv string `json:"database_url_env,omitempty"`
	// Partitions in the file's form: "0-21,40".
	Partitions Set `json:"partitions"`
}

// Set is a set of partitions, written "0-21,40" in a map file.
type Set []int

// ParseSet reads "0-21,40".
func ParseSet(s string) (Set, error) {
	var out Set
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("partitions %q: %q is not a partition number", s, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("partitions %q: %q is not a range low-high", s, part)
			}
		}
		for p := a; p <= b; p++ {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// String writes the set in its compact form.
func (s Set) String() string {
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(s[i]))
		if j > i {
			b.WriteString("-" + strconv.Itoa(s[j]))
		}
		i = j + 1
	}
	return b.String()
}

// MarshalJSON writes the compact form.
func (s Set) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

// UnmarshalJSON reads the compact form.
func (s *Set) UnmarshalJSON(b []byte) error {
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return fmt.Errorf("partitions: want a string such as \"0-21,40\": %w", err)
	}
	v, err := ParseSet(str)
	*s = v
	return err
}

// WithDefaults fills in the defaults.
func (m Map) WithDefaults() Map {
	if m.Stream == "" {
		m.Stream = "PINTENTS"
	}
	if m.Subject == "" {
		m.Subject = "pintents"
	}
	if m.Partitions == 0 {
		m.Partitions = DefaultPartitions
	}
	if m.Scope == "" {
		m.Scope = "ledger"
	}
	if m.DurablePrefix == "" {
		m.DurablePrefix = m.Scope
	}
	return m
}

// Validate reports every problem at once: each partition owned by exactly
// one shard, names unique, a database per shard.
func (m Map) Validate() error {
	var errs []error
	if m.Partitions < 1 || m.Partitions > 1024 {
		errs = append(errs, fmt.Errorf("partitions %d: want 1 to 1024", m.Partitions))
	}
	if err := inbox.ValidateID(m.Scope); err != nil {
		errs = append(errs, fmt.Errorf("scope %q: %w", m.Scope, err))
	}
	if m.Subject == "" || strings.ContainsAny(m.Subject, " *>\t") || strings.HasSuffix(m.Subject, ".") || strings.HasPrefix(m.Subject, ".") {
		errs = append(errs, fmt.Errorf("subject %q: want a literal subject prefix such as \"pintents\"", m.Subject))
	}
	if m.Stream == "" || strings.ContainsAny(m.Stream, " .*>\t") {
		errs = append(errs, fmt.Errorf("stream %q: not a stream name", m.Stream))
	}
	if strings.ContainsAny(m.DurablePrefix, " .*>\t") {
		errs = append(errs, fmt.Errorf("durable_prefix %q: not usable in a durable name", m.DurablePrefix))
	}
	if len(m.Shards) == 0 {
		errs = append(errs, errors.New("no shards"))
	}
	owner := map[int]string{}
	names := map[string]bool{}
	for _, s := range m.Shards {
		if s.Name == "" || strings.ContainsAny(s.Name, " .*>\t") {
			errs = append(errs, fmt.Errorf("shard name %q: want a short name such as \"a\"", s.Name))
		}
		if names[s.Name] {
			errs = append(errs, fmt.Errorf("shard %q: named twice", s.Name))
		}
		names[s.Name] = true
		if (s.DatabaseURL == "") == (s.DatabaseURLEnv == "") {
			errs = append(errs, fmt.Errorf("shard %q: set exactly one of database_url and database_url_env", s.Name))
		}
		for _, p := range s.Partitions {
			if p >= m.Partitions {
				errs = append(errs, fmt.Errorf("shard %q: partition %d out of range 0-%d", s.Name, p, m.Partitions-1))
				continue
			}
			if o, ok := owner[p]; ok {
				errs = append(errs, fmt.Errorf("partition %d: owned by shards %q and %q", p, o, s.Name))
			}
			owner[p] = s.Name
		}
	}
	if m.Partitions >= 1 && m.Partitions <= 1024 {
		var orphans Set
		for p := range m.Partitions {
			if _, ok := owner[p]; !ok {
				orphans = append(orphans, p)
			}
		}
		if len(orphans) > 0 {
			errs = append(errs, fmt.Errorf("partitions %s: owned by no shard (their messages would wait unconsumed)", orphans))
		}
	}
	return errors.Join(errs...)
}

// Load reads and validates a map file.
func Load(path string) (*Map, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("shard map: %w", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	var m Map
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("shard map %s: %w", path, err)
	}
	m = m.WithDefaults()
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("shard map %s: %w", path, err)
	}
	return &m, nil
}

// Save writes the map to path atomically (a temporary file renamed over
// it), so a reader never sees half a map.
func (m *Map) Save(path string) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".shardmap-*")
	if err != nil {
		return fmt.Errorf("shard map: %w", err)
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("shard map: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("shard map: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("shard map: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("shard map: %w", err)
	}
	return nil
}

// Shard returns the shard named name.
func (m *Map) Shard(name string) (*Shard, error) {
	for i := range m.Shards {
		if m.Shards[i].Name == name {
			return &m.Shards[i], nil
		}
	}
	names := make([]string, len(m.Shards))
	for i, s := range m.Shards {
		names[i] = s.Name
	}
	return nil, fmt.Errorf("shard map: no shard %q (shards: %s)", name, strings.Join(names, ", "))
}

// Owner returns the shard the map gives partition p to.
func (m *Map) Owner(p int) string {
	for _, s := range m.Shards {
		if slices.Contains(s.Partitions, p) {
			return s.Name
		}
	}
	return ""
}

// Durable is partition p's durable: one per partition, whichever shard
// runs it.
func (m *Map) Durable(p int) string { return fmt.Sprintf("%s_p%02d", m.DurablePrefix, p) }

// ShardDurable is shard name's durable when the map has [Map.ShardDurables].
func (m *Map) ShardDurable(name string) string { return m.DurablePrefix + "_s_" + name }

// HandOff is the durable that hands partition p to its next owner after a
// move, when the map has [Map.ShardDurables].
func (m *Map) HandOff(p int) string { return fmt.Sprintf("%s_h%02d", m.DurablePrefix, p) }

// ConsumerDurables returns the durables the shards consume: one per shard
// with [Map.ShardDurables], else one per partition. Hand-off durables, which
// exist only during a move, are not among them.
func (m *Map) ConsumerDurables() []string {
	if !m.ShardDurables {
		return m.Durables()
	}
	ds := make([]string, len(m.Shards))
	for i, s := range m.Shards {
		ds[i] = m.ShardDurable(s.Name)
	}
	return ds
}

// Durables returns every partition's durable, in partition order.
func (m *Map) Durables() []string {
	ds := make([]string, m.Partitions)
	for p := range ds {
		ds[p] = m.Durable(p)
	}
	return ds
}

// Filter is partition p's filter subject on the stored subjects.
func (m *Map) Filter(p int) string { return m.Subject + "." + strconv.Itoa(p) + ".>" }

// SubjectTransform returns the stream's transform: from what producers
// publish, "<subject>.<key>.>", to what it stores,
// "<subject>.<partition>.<key>.>".
func (m *Map) SubjectTransform() (src, dest string) {
	return m.Subject + ".*.>", fmt.Sprintf("%s.{{partition(%d,1)}}.{{wildcard(1)}}.>", m.Subject, m.Partitions)
}

// URL returns the shard's database URL, from the file or the environment.
func (s *Shard) URL(getenv func(string) string) (string, error) {
	if s.DatabaseURL != "" {
		return s.DatabaseURL, nil
	}
	if u := getenv(s.DatabaseURLEnv); u != "" {
		return u, nil
	}
	return "", fmt.Errorf("shard %q: %s is not set", s.Name, s.DatabaseURLEnv)
}

// Move returns a copy of the map with partition p given to shard to.
func (m *Map) Move(p int, to string) (*Map, error) {
	if p < 0 || p >= m.Partitions {
		return nil, fmt.Errorf("partition %d out of range 0-%d", p, m.Partitions-1)
	}
	if _, err := m.Shard(to); err != nil {
		return nil, err
	}
	c := *m
	c.Shards = make([]Shard, len(m.Shards))
	for i, s := range m.Shards {
		s.Partitions = slices.DeleteFunc(slices.Clone(s.Partitions), func(q int) bool { return q == p })
		if s.Name == to {
			s.Partitions = append(s.Partitions, p)
			slices.Sort(s.Partitions)
		}
		c.Shards[i] = s
	}
	return &c, nil
}
