package jsinbox

// APIPrefix is apiPrefix, for tests.
var APIPrefix = apiPrefix
