package jsinbox

// SetAckBeforeCommit switches on a deliberate bug: ack every message before
// the batch commits.
func SetAckBeforeCommit(on bool) { mutation.ackBeforeCommit = on }

// APIPrefix is apiPrefix, for tests.
var APIPrefix = apiPrefix
