package cli

// WithCreds returns a copy of the connection flags that authenticates with
// the credentials file creds instead (the same servers, TLS and context),
// for a second connection under another NATS user, such as the console's
// re-drive user beside its read-only one.
func (n *NATSFlags) WithCreds(creds string) *NATSFlags {
	c := *n
	c.creds, c.nkey, c.user, c.password, c.token, c.userJWT = creds, "", "", "", "", ""
	return &c
}
