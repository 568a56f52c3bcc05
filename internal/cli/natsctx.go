package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// natsContext is the part of a nats CLI context file
// (~/.config/nats/context/NAME.json) that names a server and credentials.
type natsContext struct {
	URL      string `json:"url"`
	Creds    string `json:"creds"`
	NKey     string `json:"nkey"`
	Cert     string `json:"cert"`
	Key      string `json:"key"`
	CA       string `json:"ca"`
	User     string `json:"user"`
	Password string `json:"password"`
	Token    string `json:"token"`
	// InboxPrefix is the reply-subject prefix (the nats CLI's
	// --inbox-prefix).
	InboxPrefix string `json:"inbox_prefix"`
	// UserJWT with NKey's seed is a decentralised-auth user without a
	// creds file.
	UserJWT string `json:"user_jwt"`
	// TLSFirst does the TLS handshake before the server's INFO.
	TLSFirst bool `json:"tls_first"`
	// SocksProxy is a SOCKS5 proxy (host:port, or socks5://host:port)
	// to dial the servers through.
	SocksProxy string `json:"socks_proxy"`
	// JSDomain and JSAPIPrefix address JetStream in another domain or
	// account.
	JSDomain    string `json:"jetstream_domain"`
	JSAPIPrefix string `json:"jetstream_api_prefix"`

	// Settings read only to refuse them: the connection they describe
	// cannot be made faithfully here, and quietly connecting some other
	// way would be worse than saying so.
	NSCLookup     string `json:"nsc"`
	JSEventPrefix string `json:"jetstream_event_prefix"`
	WinCertStore  string `json:"windows_cert_store"`
}

// unsupported reports the context settings jetinbox cannot honour, with
// what to do instead.
func (c natsContext) unsupported(name string) error {
	var errs []error
	if c.NSCLookup != "" {
		errs = append(errs, fmt.Errorf("nats context %q: nsc lookups (%q) are not run by jetinbox: "+
			"export the user's credentials (nsc generate creds) and set creds in the context, or NATS_CREDS", name, c.NSCLookup))
	}
	if c.JSEventPrefix != "" {
		errs = append(errs, fmt.Errorf("nats context %q: jetstream_event_prefix is not supported: jetinbox keeps "+
			"max-deliveries advisories under $JS.EVENT.ADVISORY and would miss events published elsewhere", name))
	}
	if c.WinCertStore != "" {
		errs = append(errs, fmt.Errorf("nats context %q: windows certificate stores are not supported: give cert, key and ca files", name))
	}
	return errors.Join(errs...)
}

// natsConfigDir is where the nats CLI keeps its contexts: under
// $XDG_CONFIG_HOME, else ~/.config; empty when neither is known.
func natsConfigDir(env Env) string {
	if x := env("XDG_CONFIG_HOME"); x != "" {
		return filepath.Join(x, "nats")
	}
	if h := env("HOME"); h != "" {
		return filepath.Join(h, ".config", "nats")
	}
	return ""
}

// loadNATSContext reads the named context, or the one the nats CLI has
// selected (context.txt) when name is empty. No name and no selection is
// no context; a named context that cannot be read is an error.
func loadNATSContext(env Env, name string) (natsContext, string, error) {
	dir := natsConfigDir(env)
	if name == "" {
		if dir == "" {
			return natsContext{}, "", nil
		}
		b, err := os.ReadFile(filepath.Join(dir, "context.txt"))
		if errors.Is(err, fs.ErrNotExist) {
			return natsContext{}, "", nil
		}
		if err != nil {
			return natsContext{}, "", fmt.Errorf("nats context selection: %w", err)
		}
		if name = strings.TrimSpace(string(b)); name == "" {
			return natsContext{}, "", nil
		}
	}
	var path string
	switch {
	case filepath.IsAbs(name):
		path = name
	case strings.Contains(name, "..") || strings.ContainsRune(name, filepath.Separator):
		return natsContext{}, "", fmt.Errorf("nats context %q: not a context name", name)
	case dir == "":
		return natsContext{}, "", fmt.Errorf("nats context %q: neither XDG_CONFIG_HOME nor HOME is set", name)
	default:
		path = filepath.Join(dir, "context", name+".json")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return natsContext{}, "", fmt.Errorf("nats context %q: %w", name, err)
	}
	var c natsContext
	if err := json.Unmarshal(b, &c); err != nil {
		return natsContext{}, "", fmt.Errorf("nats context %q (%s): %w", name, path, err)
	}
	if err := c.unsupported(name); err != nil {
		return natsContext{}, "", err
	}
	home := env("HOME")
	for _, p := range []*string{&c.Creds, &c.NKey, &c.Cert, &c.Key, &c.CA} {
		if home != "" && strings.HasPrefix(*p, "~/") {
			*p = filepath.Join(home, (*p)[2:])
		}
	}
	return c, name, nil
}
