package pollticker

const hasClock = false
