// Package servertest holds, in a directory per package, the tests of the
// library's packages that need a nats-server: kept out of those packages
// so that a module that imports the library never has nats-server in its
// go.sum. Nothing here is imported.
package servertest
