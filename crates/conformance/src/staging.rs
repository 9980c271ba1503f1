//! The u32 groups a step's metadata travels in ([`Storage::alloc_u32_group`]), checked on any
//! backend: each region reads back what was staged for it, a second upload of shorter
//! prefixes leaves the rest of each region as it was, the staging memory keeps what the host
//! left in it, a count beyond a region is an error that copies nothing, and an op reading a
//! region (gather_rows on a region that starts mid-allocation where the backend carves) sees
//! its own elements.

use tandem_core::backend::{Backend, U32Layout};

/// Region sizes that end off the alignment and one empty region.
const LENS: [usize; 5] = [5, 0, 130, 64, 1];

fn pattern(tag: u32, region: usize, i: usize) -> u32 {
    tag * 100_000 + region as u32 * 1_000 + i as u32
}

fn e(what: &'static str) -> impl Fn(tandem_core::Error) -> String {
    move |err| format!("{what}: {err}")
}

/// Runs the checks on `b`; the error says which failed.
pub fn check_u32_group<B: Backend>(b: &B) -> Result<(), String> {
    let layout = U32Layout::new(&LENS).map_err(e("layout"))?;
    let mut g = b.alloc_u32_group(&layout).map_err(e("alloc_u32_group"))?;
    if g.parts.len() != LENS.len() {
        return Err(format!("{} parts for {} regions", g.parts.len(), LENS.len()));
    }
    let stage = |g: &mut _, tag: u32, used: &[usize]| -> Result<(), String> {
        let s = b.u32_staging(g).map_err(e("u32_staging"))?;
        if s.len() < layout.total() {
            return Err(format!("staging memory of {} elements for a layout of {}", s.len(), layout.total()));
        }
        for (r, &n) in used.iter().enumerate() {
            for i in 0..n {
                s[layout.offset(r) + i] = pattern(tag, r, i);
            }
        }
        Ok(())
    };
    let read_back =
        |g: &tandem_core::backend::U32Group<B::Buf>, r: usize| b.read_u32(&g.parts[r], LENS[r]).map_err(e("read_u32"));
    // Every region whole, then shorter prefixes of a second pattern.
    stage(&mut g, 1, &LENS)?;
    b.upload_u32_group(&mut g, &LENS).map_err(e("upload_u32_group"))?;
    let short = [2, 0, 7, 0, 1];
    stage(&mut g, 2, &short)?;
    b.upload_u32_group(&mut g, &short).map_err(e("upload_u32_group (prefixes)"))?;
    for (r, &n) in short.iter().enumerate() {
        let got = read_back(&g, r)?;
        let want: Vec<u32> = (0..LENS[r]).map(|i| pattern(if i < n { 2 } else { 1 }, r, i)).collect();
        if got != want {
            return Err(format!("region {r} after uploading {n} of {}: {got:?}, expected {want:?}", LENS[r]));
        }
    }
    // The staging memory holds what the host left there.
    let s = b.u32_staging(&mut g).map_err(e("u32_staging"))?;
    if let Some(r) = (0..LENS.len())
        .find(|&r| (0..LENS[r]).any(|i| s[layout.offset(r) + i] != pattern(if i < short[r] { 2 } else { 1 }, r, i)))
    {
        return Err(format!("the staging memory of region {r} changed under the host"));
    }
    // Too many elements for region 0: an error, and nothing reaches the device.
    stage(&mut g, 3, &[5, 0, 130, 64, 1])?;
    if b.upload_u32_group(&mut g, &[6, 0, 0, 0, 0]).is_ok() {
        return Err("uploading 6 elements into a region of 5 succeeded".into());
    }
    if b.upload_u32_group(&mut g, &[1, 0]).is_ok() {
        return Err("uploading with 2 counts for 5 regions succeeded".into());
    }
    if read_back(&g, 2)? != (0..130).map(|i| pattern(if i < 7 { 2 } else { 1 }, 2, i)).collect::<Vec<_>>() {
        return Err("a refused upload changed region 2".into());
    }
    // An op reads a region as a buffer of its own: rows 2, 0, 1 of a [3, 4] table.
    let s = b.u32_staging(&mut g).map_err(e("u32_staging"))?;
    s[layout.offset(2)..layout.offset(2) + 3].copy_from_slice(&[2, 0, 1]);
    b.upload_u32_group(&mut g, &[0, 0, 3, 0, 0]).map_err(e("upload_u32_group (rows)"))?;
    let table: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let mut src = b.alloc_f32(12).map_err(e("alloc_f32"))?;
    b.write_f32(&mut src, &table).map_err(e("write_f32"))?;
    let mut out = b.alloc_f32(12).map_err(e("alloc_f32"))?;
    b.gather_rows(&src, &g.parts[2], &mut out, 3, 4).map_err(e("gather_rows on a region"))?;
    let got = b.read_f32(&out, 12).map_err(e("read_f32"))?;
    let want: Vec<f32> = [2, 0, 1].iter().flat_map(|&r| table[r * 4..r * 4 + 4].to_vec()).collect();
    if got != want {
        return Err(format!("gather_rows through region 2: {got:?}, expected {want:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_reference_stages_and_uploads_u32_groups() {
        super::check_u32_group(&tandem_reference::RefBackend::new()).unwrap();
    }
}
