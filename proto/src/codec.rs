//! The protobuf codec of `scd.v1` and `atp.v1` (set in `build.rs` with `codec_path`):
//! tonic-prost's, except that a message that does not decode (garbage bytes,
//! invalid UTF-8 in a string field) is INVALID_ARGUMENT, not INTERNAL: it is
//! the caller's bad input.

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

/// [`ProstCodec`] with decode failures mapped to INVALID_ARGUMENT.
#[derive(Debug, Clone, Default)]
pub struct ScdCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Codec for ScdCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = ScdDecoder<<ProstCodec<T, U> as Codec>::Decoder>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        ScdDecoder(self.0.decoder())
    }
}

/// A decoder whose protobuf errors are INVALID_ARGUMENT.
#[derive(Debug)]
pub struct ScdDecoder<D>(D);

impl<D: Decoder<Error = Status>> Decoder for ScdDecoder<D> {
    type Item = D::Item;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        self.0.decode(src).map_err(|s| {
            if s.code() == Code::Internal {
                Status::invalid_argument(format!("message is not valid protobuf: {}", s.message()))
            } else {
                s
            }
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
