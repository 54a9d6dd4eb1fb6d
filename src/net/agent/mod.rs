//! Advanced mode's policy agent, from the plugin's side: `registration` asks the agent for a
//! hint slot per connection (polled across calls, never waited for), `hints` maps the agent's
//! hint file and reads a connection's SUP share on every slot.

pub(crate) mod hints;
pub(crate) mod registration;
