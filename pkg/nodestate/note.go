package nodestate

// Contacts a BMC-booted machine makes with the appliance before its hostagent reports, recorded by
// NoteContact in Event.Contact: the converge phase reads them to say how far a silent machine got.
const (
	// ContactNetboot: the appliance's network boot answered the machine's MAC (a DHCP offer or
	// acknowledgement, its iPXE script); pkg/netboot.Config.Seen.
	ContactNetboot = "netboot"
	// ContactEnrolRefused: an enrolment proven to be this node's was refused (pkg/server.Enrollment).
	ContactEnrolRefused = "enrol-refused"
	// ContactEnrolled: its enrolment was accepted (or answered again with the same key).
	ContactEnrolled = "enrolled"
	// ContactEnrolPending: its enrolment is valid and waits for the operator's approval
	// (boot.enrolment.approval: operator), noted again while the machine keeps asking.
	ContactEnrolPending = "enrol-pending"
	// ContactInstalled: its live system's install notice arrived (agentapi.InstalledPathV1).
	ContactInstalled = "installed"
)

// Note appends an event to node's events.jsonl that changes nothing of its state: what the
// appliance did or refused for the node outside hostagent reports. The event carries the node's
// current state and reason and detail. Errors: a bad node name (ErrInvalidState), file system errors.
func (s *Store) Note(node, detail string) error { return s.NoteContact(node, "", detail) }

// NoteContact is Note for a contact the machine made (ContactNetboot, ContactEnrolRefused,
// ContactEnrolled, ContactEnrolPending, ContactInstalled; "" for none), kept in the event's Contact.
func (s *Store) NoteContact(node, contact, detail string) error {
	if err := checkNode(node); err != nil {
		return err
	}
	st, found, unlock, err := s.lockRead(node)
	if err != nil {
		return err
	}
	defer unlock()
	st.Node = node
	ev := Event{Time: s.now(), Node: node, BootID: st.BootID, Contact: contact, Detail: detail, State: st.State, Reason: st.Reason}
	if found {
		// The note moves nothing: status.json stays as it is (no rewrite, no fsync).
		return s.appendEvent(node, ev)
	}
	// A node with no record yet gets one (state unknown), so its status lists it with the note.
	st.Updated = ev.Time
	return s.commit(st, ev)
}
