package nodestate

// Note appends an event to node's events.jsonl that changes nothing of its state: what the
// appliance did or refused for the node outside hostagent reports (an enrolment accepted or refused,
// pkg/server's Enrollment). The event carries the node's current state and reason and detail.
// Errors: a bad node name (ErrInvalidState), file system errors.
func (s *Store) Note(node, detail string) error {
	if err := checkNode(node); err != nil {
		return err
	}
	st, _, unlock, err := s.lockRead(node)
	if err != nil {
		return err
	}
	defer unlock()
	st.Node = node
	if st.Updated.IsZero() {
		st.Updated = s.now()
	}
	// commit rewrites status.json with the same content (Updated unchanged): the note moves nothing.
	return s.commit(st, Event{Time: s.now(), Node: node, BootID: st.BootID, Detail: detail, State: st.State, Reason: st.Reason})
}
