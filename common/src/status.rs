//! Wire status codes of the data-transfer protocol.
//!
//! The codes are stable: they are written on the wire as one byte and never renumbered.
//! The first eight match HDFS's `Status` enum; the rest are Sluice's.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// The outcome of an op or of one packet at one DataNode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    /// Done.
    Success = 0,
    /// A failure with no more specific code (an I/O error, a failed downstream connection).
    Error = 1,
    /// A checksum did not match the data.
    ErrorChecksum = 2,
    /// The request was malformed or does not fit the replica's state.
    ErrorInvalid = 3,
    /// The replica already exists.
    ErrorExists = 4,
    /// The op's block access token is missing, expired, forged or does not allow the op.
    ErrorAccessToken = 5,
    /// The op is not supported by this DataNode.
    ErrorUnsupported = 7,
    /// The replica is not on this DataNode.
    ErrorNotFound = 20,
    /// An offset at or past the end of the replica.
    ErrorOutOfRange = 21,
    /// A frame larger than the configured maximum.
    ErrorFrameTooLarge = 22,
    /// A frame that could not be decoded.
    ErrorBadFrame = 23,
    /// The peer speaks an unsupported protocol version.
    ErrorVersion = 24,
    /// The request's generation stamp does not fit the replica's: older than a writer or a
    /// recovery needs, or (for a read) not exactly the replica's.
    ErrorStaleGenStamp = 25,
    /// The DataNode is out of space or memory for the request.
    ErrorNoSpace = 26,
    /// A local write, flush or fsync failed.
    ErrorIo = 27,
    /// The DataNode is at a resource cap (read-buffer memory): try another replica, or later.
    ErrorBusy = 28,
}

impl Status {
    /// The one-byte wire code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The status for a wire code; `None` for a code this build does not know.
    pub fn from_code(code: u8) -> Option<Status> {
        use Status::*;
        Some(match code {
            0 => Success,
            1 => Error,
            2 => ErrorChecksum,
            3 => ErrorInvalid,
            4 => ErrorExists,
            5 => ErrorAccessToken,
            7 => ErrorUnsupported,
            20 => ErrorNotFound,
            21 => ErrorOutOfRange,
            22 => ErrorFrameTooLarge,
            23 => ErrorBadFrame,
            24 => ErrorVersion,
            25 => ErrorStaleGenStamp,
            26 => ErrorNoSpace,
            27 => ErrorIo,
            28 => ErrorBusy,
            _ => return None,
        })
    }

    /// True for [`Status::Success`].
    pub fn is_success(self) -> bool {
        self == Status::Success
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Status::Success => "SUCCESS",
            Status::Error => "ERROR",
            Status::ErrorChecksum => "ERROR_CHECKSUM",
            Status::ErrorInvalid => "ERROR_INVALID",
            Status::ErrorExists => "ERROR_EXISTS",
            Status::ErrorAccessToken => "ERROR_ACCESS_TOKEN",
            Status::ErrorUnsupported => "ERROR_UNSUPPORTED",
            Status::ErrorNotFound => "ERROR_NOT_FOUND",
            Status::ErrorOutOfRange => "ERROR_OUT_OF_RANGE",
            Status::ErrorFrameTooLarge => "ERROR_FRAME_TOO_LARGE",
            Status::ErrorBadFrame => "ERROR_BAD_FRAME",
            Status::ErrorVersion => "ERROR_VERSION",
            Status::ErrorStaleGenStamp => "ERROR_STALE_GENSTAMP",
            Status::ErrorNoSpace => "ERROR_NO_SPACE",
            Status::ErrorIo => "ERROR_IO",
            Status::ErrorBusy => "ERROR_BUSY",
        };
        f.write_str(name)
    }
}

impl Serialize for Status {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(self.code())
    }
}

impl<'de> Deserialize<'de> for Status {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let code = u8::deserialize(d)?;
        Status::from_code(code)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown status code {code}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_is_rejected() {
        for code in 0..=255u8 {
            if let Some(s) = Status::from_code(code) {
                assert_eq!(s.code(), code);
            }
        }
        assert_eq!(Status::from_code(6), None);
        assert_eq!(Status::from_code(5), Some(Status::ErrorAccessToken));
        assert_eq!(Status::ErrorChecksum.code(), 2);
    }
}
