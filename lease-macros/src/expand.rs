//! Generation only: the guarded function, built from checked arguments and the parsed function.
//!
//! `async fn f(args) -> T { body }` becomes
//! `async fn f(args) -> Result<T, ::lease_core::GuardError> { <acquire, run body, release> }`.
//! The signature is rewritten in place, so rustdoc and rust-analyzer show the real one; the body
//! moves unchanged into an `async move` block that `lease_core::guarded` runs under the lease, so
//! `return` and `?` inside it keep their meaning. Every path in the output is absolute
//! (`::lease_core::…`, `::core::…`), so names in the user's crate cannot capture them.

use proc_macro2::{Delimiter, Group, Ident, Punct, Spacing, Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{AttrStyle, Attribute, Expr, LitInt, Meta, ReturnType, Type};

use crate::attr::{Errors, GuardedFn, Kind, LeaseArgs, Millis, RawArgs, TargetArg, WaitArg};

/// The whole attribute: parse, check, generate. On any error the function is emitted unchanged
/// next to the errors, so the rest of the crate (and the IDE) still sees it.
pub(crate) fn lease_attribute(kind: Kind, args: TokenStream, item: TokenStream) -> TokenStream {
    let func = match syn::parse2::<GuardedFn>(item.clone()) {
        Ok(func) => func,
        Err(error) => {
            let error = error.into_compile_error();
            return quote!(#item #error);
        }
    };
    let mut func = func;
    let mut errors = Errors::default();
    let args = syn::parse2::<RawArgs>(args).and_then(|raw| LeaseArgs::from_raw(kind, raw));
    // Lease attributes stacked below this one are taken in here, so the function gets one
    // `Result<T, GuardError>` instead of one `Result` per attribute.
    let stacked = take_stacked(&mut func.attrs);
    let mut layers = Vec::new();
    for layer in std::iter::once(args).chain(stacked) {
        match layer {
            Ok(layer) => layers.push(layer),
            Err(error) => errors.push(error),
        }
    }
    if func.sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            func.sig.fn_token.span,
            format!(
                "{} can only guard an `async fn`: the lease is acquired and watched \
                 asynchronously; write `async fn`",
                kind.attribute()
            ),
        ));
    }
    match errors.into_result() {
        Ok(()) => guarded_fn(&layers, func),
        Err(error) => {
            let error = error.into_compile_error();
            quote!(#item #error)
        }
    }
}

/// Removes the `#[leader_only]` and `#[semaphore]` attributes (by the last segment of their
/// path, so `#[lease_core::semaphore]` too) from `attrs` and reads their arguments, in order.
fn take_stacked(attrs: &mut Vec<Attribute>) -> Vec<syn::Result<LeaseArgs>> {
    let mut stacked = Vec::new();
    attrs.retain(|attr| {
        let kind = match attr.path().segments.last().map(|s| s.ident.to_string()) {
            Some(name) if name == "leader_only" => Kind::Leader,
            Some(name) if name == "semaphore" => Kind::Semaphore,
            _ => return true,
        };
        if !matches!(attr.style, AttrStyle::Outer) {
            return true;
        }
        let raw = match &attr.meta {
            Meta::List(list) => syn::parse2::<RawArgs>(list.tokens.clone()),
            Meta::Path(_) => syn::parse2::<RawArgs>(TokenStream::new()),
            Meta::NameValue(value) => Err(syn::Error::new(
                value.eq_token.span,
                format!(
                    "{} takes its arguments in parentheses, e.g. {}",
                    kind.attribute(),
                    kind.example()
                ),
            )),
        };
        stacked.push(raw.and_then(|raw| LeaseArgs::from_raw(kind, raw)));
        false
    });
    stacked
}

fn guarded_fn(layers: &[LeaseArgs], func: GuardedFn) -> TokenStream {
    let GuardedFn {
        attrs,
        vis,
        mut sig,
        block,
    } = func;
    let (outer_attrs, inner_attrs): (Vec<_>, Vec<_>) = attrs
        .into_iter()
        .partition(|attr| matches!(attr.style, AttrStyle::Outer));

    // The body's own type, with `impl Trait` left to inference: it is named again below, where
    // an opaque type cannot be written.
    let (output, output_span) = match &sig.output {
        ReturnType::Default => (quote!(()), sig.ident.span()),
        ReturnType::Type(_, ty) => (ty.to_token_stream(), ty.span()),
    };
    let body_output = match &sig.output {
        ReturnType::Default => quote!(()),
        ReturnType::Type(_, ty) => {
            let mut ty = (**ty).clone();
            EraseImplTrait.visit_type_mut(&mut ty);
            ty.into_token_stream()
        }
    };
    sig.output = syn::parse_quote_spanned! {output_span=>
        -> ::core::result::Result<#output, ::lease_core::GuardError>
    };

    // Each layer's spec and backend are evaluated first, in order, before the body takes its
    // captures. Mixed-site hygiene: the user's body cannot see (or shadow) these locals.
    let mut locals = TokenStream::new();
    let lease_backend = Ident::new("__LeaseBackend", Span::mixed_site());
    if layers.iter().any(|layer| layer.backend.is_some()) {
        locals.extend(lease_backend_trait(&lease_backend));
    }
    let mut guarded_calls = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        let spec = spec(layer);
        let spec_var = Ident::new(&format!("__lease_spec_{i}"), Span::mixed_site());
        locals.extend(quote!(let #spec_var = #spec;));
        let guarded: Box<dyn Fn(TokenStream) -> TokenStream> = match &layer.backend {
            None => {
                Box::new(move |work| quote!(::lease_core::guarded_by_default(&#spec_var, #work)))
            }
            Some(backend) => {
                let backend_var = Ident::new(&format!("__lease_backend_{i}"), Span::mixed_site());
                let borrowed = borrow_at(backend);
                locals.extend(quote! {
                    // A borrow in a `let` lives to the end of the function, so `backend` may be
                    // a temporary (`self.backend.clone()`); the coercion checks its type.
                    let #backend_var: &dyn #lease_backend<_> = #borrowed;
                });
                Box::new(move |work| {
                    quote! {
                        ::lease_core::guarded(#backend_var.__lease_backend(), &#spec_var, #work)
                    }
                })
            }
        };
        guarded_calls.push(guarded);
    }
    let body = quote_spanned! {block.span()=>
        ::lease_core::__private::body::<#body_output, _>(async move #block)
    };
    // The innermost lease runs the body; each outer one runs the next, and their outcomes fold
    // into one `Result<T, GuardError>`.
    let mut run = body;
    for (depth, guarded) in guarded_calls.iter().enumerate().rev() {
        let call = guarded(run);
        run = if depth + 1 == guarded_calls.len() {
            call
        } else {
            quote!(async { ::lease_core::__private::flatten(#call.await) })
        };
    }
    quote! {
        #(#outer_attrs)*
        #vis #sig {
            #(#inner_attrs)*
            #locals
            #run.await
        }
    }
}

/// What `backend = …` may be: a value of a type that implements `lease_core::Backend` (which
/// includes `Arc<B>`, `Box<B>` and `Arc<dyn Backend>`), or a reference to one, to any depth
/// (`&Memory`, `&&Memory`, `&dyn Backend`). One way through for each, told apart by the `Depth`
/// parameter, so the compiler infers it; a value of any other type is an E0277 at the user's
/// expression with this trait's message, which says what was expected.
///
/// Declared inside each function that names a backend: a proc-macro crate exports only macros,
/// and a helper in `lease_core` resolved through method-call auto-deref (as the generated code
/// once called) fails with an E0599 about the helper's method instead.
/// `do_not_recommend` keeps the compiler from explaining the error through these impls.
fn lease_backend_trait(name: &Ident) -> TokenStream {
    quote! {
        #[diagnostic::on_unimplemented(
            message = "`backend = …` must be a lease backend or a reference to one, and `{Self}` is neither",
            label = "expected a lease backend, found `{Self}`",
            note = "a lease backend is a value whose type implements `lease_core::Backend` (`Memory`, \
                    `Consul`, `Etcd`, `Amqp`, an `Arc` or `Box` of one, `Arc<dyn Backend>`), or a \
                    reference to one: `backend = &consul`, `backend = &self.backend`, \
                    `backend = self.backend.clone()`",
            note = "for a backend behind another smart pointer (a `LazyLock`, an `Rc`), write a \
                    reference to the backend itself: `backend = &*BACKEND`"
        )]
        trait #name<Depth> {
            fn __lease_backend(&self) -> &dyn ::lease_core::Backend;
        }
        #[diagnostic::do_not_recommend]
        impl<B: ::lease_core::Backend> #name<()> for B {
            fn __lease_backend(&self) -> &dyn ::lease_core::Backend {
                self
            }
        }
        #[diagnostic::do_not_recommend]
        impl #name<()> for dyn ::lease_core::Backend {
            fn __lease_backend(&self) -> &dyn ::lease_core::Backend {
                self
            }
        }
        #[diagnostic::do_not_recommend]
        impl<B: ?::core::marker::Sized + #name<Depth>, Depth> #name<(Depth,)> for &B {
            fn __lease_backend(&self) -> &dyn ::lease_core::Backend {
                (**self).__lease_backend()
            }
        }
    }
}

/// `&backend`, located so that the borrow's span is exactly the user's expression: an error
/// about its type (a backend of the wrong type) then points there, not at the attribute.
///
/// The `&` takes the span of the expression's first token and the expression's own tokens end
/// it. Parentheses, which an operand looser than `&` needs (`&(a + b)`), take one span on stable
/// Rust, so there the error points at the first token.
fn borrow_at(backend: &Expr) -> TokenStream {
    let first = backend
        .to_token_stream()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |token| token.span());
    let mut amp = Punct::new('&', Spacing::Alone);
    amp.set_span(first);
    let binds_tighter_than_borrow = matches!(
        backend,
        Expr::Path(_)
            | Expr::Lit(_)
            | Expr::Field(_)
            | Expr::MethodCall(_)
            | Expr::Call(_)
            | Expr::Index(_)
            | Expr::Macro(_)
            | Expr::Paren(_)
            | Expr::Reference(_)
            | Expr::Unary(_)
            | Expr::Try(_)
            | Expr::Await(_)
            | Expr::Tuple(_)
            | Expr::Array(_)
            | Expr::Struct(_)
            | Expr::Block(_)
    );
    if binds_tighter_than_borrow {
        quote!(#amp #backend)
    } else {
        let mut parenthesized = Group::new(Delimiter::Parenthesis, backend.to_token_stream());
        parenthesized.set_span(first);
        quote!(#amp #parenthesized)
    }
}

/// `::lease_core::LeaseSpec::…(…)` with a setter per option given; each part spanned at the
/// user's token, so a type error points there.
fn spec(args: &LeaseArgs) -> TokenStream {
    let mut spec = match &args.target {
        TargetArg::Leader { key } => quote_spanned! {key.span()=>
            ::lease_core::LeaseSpec::leader(#key)
        },
        TargetArg::Semaphore { name, limit } => quote_spanned! {name.span()=>
            ::lease_core::LeaseSpec::semaphore(#name, #limit)
        },
    };
    if let Some(wait) = &args.wait {
        let wait = match wait {
            WaitArg::Forever => quote!(::lease_core::Wait::Forever),
            WaitArg::Never => quote!(::lease_core::Wait::Never),
            WaitArg::UpTo(up_to) => {
                let up_to = duration(up_to);
                quote_spanned!(up_to.span()=> ::lease_core::Wait::UpTo(#up_to))
            }
        };
        spec.extend(quote!(.wait(#wait)));
    }
    if let Some(ttl) = &args.ttl {
        let ttl = duration(ttl);
        spec.extend(quote!(.ttl(#ttl)));
    }
    if let Some(lock_delay) = &args.lock_delay {
        let lock_delay = duration(lock_delay);
        spec.extend(quote!(.lock_delay(#lock_delay)));
    }
    if let Some(min_hold) = &args.min_hold {
        let min_hold = duration(min_hold);
        spec.extend(quote!(.min_hold(#min_hold)));
    }
    if let Some(max_run) = &args.max_run {
        let max_run = duration(max_run);
        spec.extend(quote!(.max_run(#max_run)));
    }
    spec
}

fn duration(millis: &Millis) -> TokenStream {
    let value = LitInt::new(&format!("{}u64", millis.millis), millis.span);
    quote_spanned!(millis.span=> ::core::time::Duration::from_millis(#value))
}

/// Replaces every `impl Trait` in a type with `_`.
struct EraseImplTrait;

impl VisitMut for EraseImplTrait {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::ImplTrait(impl_trait) = ty {
            let underscore = syn::Token![_](impl_trait.span());
            *ty = syn::parse_quote!(#underscore);
            return;
        }
        syn::visit_mut::visit_type_mut(self, ty);
    }
}
