package pollticker

const hasClock = true
