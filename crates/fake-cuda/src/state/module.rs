//! Modules and functions: a PTX image's entries matched, by name and signature, to the host
//! builds of the kernels; the function attributes the backend asks and sets.

use cudarc::driver::sys::CUresult;

use crate::kernels::{self, HostKernel};
use crate::ptx;

use super::{fail, Res, State};

pub(super) struct Func {
    pub(super) entry: ptx::Entry,
    pub(super) kernel: Option<HostKernel>,
    pub(super) max_dynamic_smem: usize,
}

pub(super) const STATIC_SMEM_LIMIT: usize = 48 * 1024;
pub(super) const OPTIN_SMEM_LIMIT: usize = 227 * 1024;

impl State {
    pub fn load_module(&mut self, text: &str) -> Res<usize> {
        let entries =
            ptx::parse(text).map_err(|e| fail(CUresult::CUDA_ERROR_INVALID_PTX, &format!("cuModuleLoadData: {e}")))?;
        if entries.is_empty() {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_PTX,
                "cuModuleLoadData: no .entry in the image (PTX text expected)",
            ));
        }
        let host = kernels::all();
        let mut funcs = vec![];
        for e in entries {
            let kernel = host.get(e.name.as_str()).copied();
            if let Some(k) = &kernel {
                let same = k.sig.len() == e.params.len()
                    && e.params.iter().zip(k.sig.iter().zip(k.sizes)).all(|(p, (&c, &n))| p.matches(c, n));
                if !same {
                    return Err(fail(
                        CUresult::CUDA_ERROR_INVALID_PTX,
                        &format!(
                            "kernel {}: the PTX takes {:?} but the host build of kernels/{}.cu takes `{}` (p pointer, i 32-bit, l 64-bit, f float): rebuild tandem-fake-cuda from the same sources",
                            e.name,
                            e.params,
                            k.file,
                            String::from_utf8_lossy(k.sig)
                        ),
                    ));
                }
            }
            let id = self.handle();
            self.funcs.insert(id, Func { entry: e, kernel, max_dynamic_smem: STATIC_SMEM_LIMIT });
            funcs.push(id);
        }
        let id = self.handle();
        self.modules.insert(id, funcs);
        Ok(id)
    }

    pub fn unload_module(&mut self, id: usize) -> Res<()> {
        let funcs = self
            .modules
            .remove(&id)
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, &format!("module {id:#x} does not exist")))?;
        for f in funcs {
            self.funcs.remove(&f);
        }
        Ok(())
    }

    pub fn get_function(&mut self, module: usize, name: &str) -> Res<usize> {
        let funcs = self
            .modules
            .get(&module)
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, &format!("module {module:#x} does not exist")))?;
        funcs.iter().copied().find(|f| self.funcs[f].entry.name == name).ok_or_else(|| {
            fail(CUresult::CUDA_ERROR_NOT_FOUND, &format!("cuModuleGetFunction: no kernel `{name}` in the module"))
        })
    }

    pub(super) fn func(&self, id: usize) -> Res<&Func> {
        self.funcs
            .get(&id)
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, &format!("function {id:#x} does not exist")))
    }

    pub fn function_attribute(&self, id: usize, attrib: i32) -> Res<i32> {
        let f = self.func(id)?;
        Ok(match attrib {
            0 => f.entry.max_threads.unwrap_or(1024) as i32,
            1 => f.entry.static_smem as i32,
            8 => f.max_dynamic_smem as i32,
            _ => {
                return Err(fail(
                    CUresult::CUDA_ERROR_NOT_SUPPORTED,
                    &format!("cuFuncGetAttribute: attribute {attrib} is not modelled"),
                ))
            }
        })
    }

    pub fn set_function_attribute(&mut self, id: usize, attrib: i32, value: i32) -> Res<()> {
        let f = self
            .funcs
            .get_mut(&id)
            .ok_or_else(|| fail(CUresult::CUDA_ERROR_INVALID_HANDLE, &format!("function {id:#x} does not exist")))?;
        match attrib {
            8 if value >= 0 && value as usize + f.entry.static_smem <= OPTIN_SMEM_LIMIT => {
                f.max_dynamic_smem = value as usize;
                Ok(())
            }
            8 => Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                &format!("{}: {value} bytes of dynamic shared memory exceed the opt-in limit", f.entry.name),
            )),
            _ => Err(fail(
                CUresult::CUDA_ERROR_NOT_SUPPORTED,
                &format!("cuFuncSetAttribute: attribute {attrib} is not modelled"),
            )),
        }
    }
}
