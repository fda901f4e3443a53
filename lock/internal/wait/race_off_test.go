//go:build !race

package wait

const raceEnabled = false
