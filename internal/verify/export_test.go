package verify

// WithChunk sets how many stream messages Run judges at a time.
func WithChunk(o Options, n int) Options {
	o.chunk = n
	return o
}
