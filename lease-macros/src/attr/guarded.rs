//! [`GuardedFn`]: the function the attribute is put on.

use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Block, Signature, Token, Visibility};

/// The function the attribute is put on: anything with a signature and a body (a free function,
/// a method in an impl block, a provided method in a trait).
pub(crate) struct GuardedFn {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    pub(crate) block: Block,
}

impl Parse for GuardedFn {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut attrs = input.call(Attribute::parse_outer)?;
        let vis = input.parse()?;
        let sig: Signature = input.parse()?;
        if input.peek(Token![;]) {
            return Err(syn::Error::new(
                input.span(),
                "a function without a body cannot be guarded: put the attribute on the \
                 implementation (or give the trait method a default body)",
            ));
        }
        let content;
        let brace_token = syn::braced!(content in input);
        attrs.extend(content.call(Attribute::parse_inner)?);
        let stmts = content.call(Block::parse_within)?;
        Ok(GuardedFn {
            attrs,
            vis,
            sig,
            block: Block { brace_token, stmts },
        })
    }
}
