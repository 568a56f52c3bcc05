package inbox

import "errors"

// ErrDatabaseUnfit is wrapped by a store's Check when the database answers
// but cannot take batches as it is set up: the session is read-only, the
// connection cannot hold a transaction, or the role lacks a grant the claim
// needs. An operator must change the deployment; no retry helps before.
var ErrDatabaseUnfit = errors.New("inbox: the database cannot take batches as it is set up")
