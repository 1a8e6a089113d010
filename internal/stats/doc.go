// Package stats holds the small statistics udskit's measuring code shares
// (bench, clocktime, the proxy benchmark): one Median, not one per package.
package stats
