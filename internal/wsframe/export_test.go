package wsframe

// MaxBacklog is maxBacklog, for the tests of the write side.
const MaxBacklog = maxBacklog

// Flushing reports whether a flush goroutine is running.
func (c *Conn) Flushing() bool {
	w := &c.sock.wr
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.kept != nil
}
