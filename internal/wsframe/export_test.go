package wsframe

// MaxBacklog is maxBacklog, for the tests of the write side.
const MaxBacklog = maxBacklog

// Flushing reports whether a flush goroutine is running.
func (c *Conn) Flushing() bool {
	c.wr.mu.Lock()
	defer c.wr.mu.Unlock()
	return c.wr.kept != nil
}
