//! What a handshake's messages travel on: its own TCP connection (the first handshake between
//! two processes, whose connection then becomes their link), or the link they already share
//! (src/net/observe/link_ride.rs). `connect` and `accept` move the same fixed-size messages
//! either way (docs/PROTOCOL.md §1).

use std::net::{SocketAddrV4, TcpStream};

use crate::error::{Error, Result};
use crate::net::data::request::now_ns;
use crate::net::observe::link::{address_pair, Ride, RideError};
use crate::net::setup::oob::Transfer;

/// A handshake's carrier.
pub(crate) enum Channel {
    /// A TCP connection of its own.
    Own(TcpStream),
    /// A ride on the link to the peer's process; `first` is the message that opened it
    /// (the acceptor end receives it with the ride); `lost` once a send or receive found the
    /// link ended (rather than the peer giving the handshake up).
    Link {
        ride: Ride,
        first: Option<Vec<u8>>,
        lost: bool,
    },
}

/// A ride's error as the call's, noting in `lost` whether the link itself ended.
fn ride_error(error: RideError, peer: &str, lost: &mut bool) -> Error {
    *lost = matches!(error, RideError::LinkEnded(_));
    Error::remote(format!("handshake with {peer}: {error}"))
}

impl Channel {
    /// A ride at the acceptor end, with the request that opened it.
    pub(crate) fn accepted(ride: Ride, request: Vec<u8>) -> Channel {
        Channel::Link {
            ride,
            first: Some(request),
            lost: false,
        }
    }

    /// A ride at the connector end.
    pub(crate) fn riding(ride: Ride) -> Channel {
        Channel::Link {
            ride,
            first: None,
            lost: false,
        }
    }

    /// Sends what it can of `transfer`; `Ok(true)` once all of it is gone.
    pub(crate) fn send<const N: usize>(
        &mut self,
        transfer: &mut Transfer<N>,
        peer: &str,
    ) -> Result<bool> {
        match self {
            Channel::Own(stream) => transfer.send(stream, peer),
            Channel::Link { ride, lost, .. } => {
                if !transfer.is_done() {
                    ride.send(transfer.bytes(), now_ns())
                        .map_err(|e| ride_error(e, peer, lost))?;
                    transfer.mark_sent();
                }
                Ok(true)
            }
        }
    }

    /// Receives what has come of `transfer`; `Ok(true)` once all of it is in.
    pub(crate) fn receive<const N: usize>(
        &mut self,
        transfer: &mut Transfer<N>,
        peer: &str,
    ) -> Result<bool> {
        let (ride, first, lost) = match self {
            Channel::Own(stream) => return transfer.receive(stream, peer),
            Channel::Link { ride, first, lost } => (ride, first, lost),
        };
        let message = match first.take() {
            Some(message) => message,
            None => match ride
                .receive(now_ns())
                .map_err(|e| ride_error(e, peer, lost))?
            {
                Some(message) => message,
                None => return Ok(false),
            },
        };
        if !transfer.fill(&message) {
            return Err(Error::remote(format!(
                "handshake with {peer}: a message of {} bytes where {N} were due",
                message.len()
            )));
        }
        Ok(true)
    }

    /// The address pair the handshake runs over: (this side's, the peer's).
    pub(crate) fn addresses(&self) -> Result<(SocketAddrV4, SocketAddrV4)> {
        let pair = match self {
            Channel::Own(stream) => address_pair(stream),
            Channel::Link { ride, .. } => Some(ride.addresses()),
        };
        pair.ok_or_else(|| Error::system("the control connection has no IPv4 address pair"))
    }

    /// The handshake's own connection (none when it rides a link).
    pub(crate) fn stream(&self) -> Option<&TcpStream> {
        match self {
            Channel::Own(stream) => Some(stream),
            Channel::Link { .. } => None,
        }
    }

    /// The ride, when the handshake is on a link.
    pub(crate) fn ride(&self) -> Option<&Ride> {
        match self {
            Channel::Own(_) => None,
            Channel::Link { ride, .. } => Some(ride),
        }
    }

    /// Whether the last send or receive found the link the handshake rides ended (the
    /// connector then starts it again on a connection of its own: the acceptor may have closed
    /// its end before reading the open). Not when the peer gave the handshake up.
    pub(crate) fn link_lost(&self) -> bool {
        matches!(self, Channel::Link { lost: true, .. })
    }

    /// What the other end hears if the handshake is dropped now (a ride's only).
    pub(crate) fn set_reason(&mut self, reason: &str) {
        if let Channel::Link { ride, .. } = self {
            ride.set_reason(reason);
        }
    }

    /// The handshake completed (a ride then gives its share back without a word).
    pub(crate) fn finish(&mut self) {
        if let Channel::Link { ride, .. } = self {
            ride.finish();
        }
    }
}
