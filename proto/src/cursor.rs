//! Little-endian field cursors over fixed-size message buffers.
//!
//! Why: the handshake and agent messages cross process and host boundaries, so their bytes are
//! written field by field in a declared order and endianness, never by transmuting a
//! `#[repr(C)]` struct (whose padding and layout would silently become the protocol). Every
//! message is a fixed-size array and every layout is a constant sequence of fields, so a cursor
//! can only run past the end through a layout bug, which the message tests catch by checking
//! that encoding fills the buffer exactly.

/// Writes fields in order into a byte buffer.
pub struct Writer<'a> {
    bytes: &'a mut [u8],
    position: usize,
}

impl<'a> Writer<'a> {
    /// Cursor at the start of `bytes`.
    pub fn new(bytes: &'a mut [u8]) -> Self {
        Writer { bytes, position: 0 }
    }

    /// Append raw bytes.
    pub fn bytes(&mut self, value: &[u8]) {
        self.bytes[self.position..self.position + value.len()].copy_from_slice(value);
        self.position += value.len();
    }

    /// Append one byte.
    pub fn u8(&mut self, value: u8) {
        self.bytes(&[value]);
    }

    /// Append a little-endian `u16`.
    pub fn u16(&mut self, value: u16) {
        self.bytes(&value.to_le_bytes());
    }

    /// Append a little-endian `u32`.
    pub fn u32(&mut self, value: u32) {
        self.bytes(&value.to_le_bytes());
    }

    /// Append a little-endian `i32`.
    pub fn i32(&mut self, value: i32) {
        self.bytes(&value.to_le_bytes());
    }

    /// Append a little-endian `u64`.
    pub fn u64(&mut self, value: u64) {
        self.bytes(&value.to_le_bytes());
    }

    /// Bytes written so far.
    pub fn position(&self) -> usize {
        self.position
    }
}

/// Reads fields in order from a byte buffer.
pub struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Reader<'a> {
    /// Cursor at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, position: 0 }
    }

    /// The next `N` bytes.
    pub fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut value = [0u8; N];
        value.copy_from_slice(&self.bytes[self.position..self.position + N]);
        self.position += N;
        value
    }

    /// The next byte.
    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    /// The next little-endian `u16`.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    /// The next little-endian `u32`.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    /// The next little-endian `i32`.
    pub fn i32(&mut self) -> i32 {
        i32::from_le_bytes(self.array())
    }

    /// The next little-endian `u64`.
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    /// Bytes read so far.
    pub fn position(&self) -> usize {
        self.position
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_roundtrip_little_endian() {
        let mut buffer = [0u8; 21];
        let mut writer = Writer::new(&mut buffer);
        writer.u8(0xA1);
        writer.u16(0x0102);
        writer.u32(0x0304_0506);
        writer.i32(-2);
        writer.u64(0x0708_090A_0B0C_0D0E);
        writer.bytes(&[9, 8]);
        assert_eq!(writer.position(), 21);
        assert_eq!(buffer[1..3], [0x02, 0x01]);
        let mut reader = Reader::new(&buffer);
        assert_eq!(reader.u8(), 0xA1);
        assert_eq!(reader.u16(), 0x0102);
        assert_eq!(reader.u32(), 0x0304_0506);
        assert_eq!(reader.i32(), -2);
        assert_eq!(reader.u64(), 0x0708_090A_0B0C_0D0E);
        assert_eq!(reader.array::<2>(), [9, 8]);
        assert_eq!(reader.position(), 21);
    }

    #[test]
    #[should_panic]
    fn overrun_is_a_layout_bug() {
        let mut buffer = [0u8; 3];
        Writer::new(&mut buffer).u32(1);
    }
}
