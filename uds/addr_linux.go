package uds

const abstractSupported = true
