package inbox

// SetMutation switches a deliberate bug on; tests use it to check that the
// guarantee tests can fail. It returns a function that switches it off.
func SetMutation(name string) (undo func()) {
	switch name {
	case "effect-before-claim":
		mutation.effectBeforeClaim = true
	case "effect-outside-tx":
		mutation.effectOutsideTx = true
	case "no-copy-claim":
		mutation.noCopyClaim = true
	case "blind-copy-claim":
		mutation.blindCopyClaim = true
	default:
		panic("unknown mutation " + name)
	}
	return func() {
		mutation.effectBeforeClaim, mutation.effectOutsideTx = false, false
		mutation.noCopyClaim, mutation.blindCopyClaim = false, false
	}
}

// CopyClaimThreshold is the smallest batch claimed with COPY.
const CopyClaimThreshold = copyClaimThreshold
