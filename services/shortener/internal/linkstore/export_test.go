//go:build integration

package linkstore

// Connect is connect, for the contract test (package linkstore_test).
var Connect = connect
