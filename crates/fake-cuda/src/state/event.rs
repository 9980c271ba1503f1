//! Events: a point in a stream's work, recorded, waited for by the host or by another stream.

use cudarc::driver::sys::CUresult;

use super::stream::Op;
use super::{fail, Res, State};

impl State {
    pub fn new_event(&mut self) -> usize {
        let id = self.handle();
        self.events.insert(id, None);
        id
    }

    pub(super) fn event(&self, id: usize) -> Res<Option<(usize, u64)>> {
        self.events
            .get(&id)
            .copied()
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, &format!("event {id:#x} does not exist")))
    }

    pub fn destroy_event(&mut self, id: usize) -> Res<()> {
        self.event(id)?;
        self.events.remove(&id);
        Ok(())
    }

    pub fn record_event(&mut self, id: usize, stream: usize) -> Res<()> {
        self.event(id)?;
        self.enqueue(stream, Op::Record)?;
        let seq = self.streams[&stream].next - 1;
        self.events.insert(id, Some((stream, seq)));
        Ok(())
    }

    pub fn sync_event(&mut self, id: usize) -> Res<()> {
        let at = self.event(id)?;
        self.refuse_while_capturing("cuEventSynchronize")?;
        match at {
            Some((stream, seq)) => self.drain_to(stream, seq + 1),
            None => Ok(()), // never recorded: complete
        }
    }

    pub fn wait_event(&mut self, stream: usize, id: usize) -> Res<()> {
        match self.event(id)? {
            Some((s, seq)) => self.enqueue(stream, Op::Wait { stream: s, seq }),
            None => self.stream(stream),
        }
    }
}
